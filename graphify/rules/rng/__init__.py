"""rng: random-number state handled on the host. One module per rule; shared.py holds what they share."""
