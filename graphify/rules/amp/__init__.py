"""amp-grad-scaler: mixed precision pieces that sync or cache. One module per rule; shared.py holds what they share."""
