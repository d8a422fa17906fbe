"""dynamic-shape: per-step input shapes that differ from the captured ones. One module per rule; shared.py holds what they share."""
