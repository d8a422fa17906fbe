"""non-capturable-optimizer and lr-scheduler: optimizer state and learning rates that capture freezes. One module per rule; shared.py holds what they share."""
