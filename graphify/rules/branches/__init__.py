"""data-dependent-branch: Python control flow decided by a tensor's value. One module per rule; shared.py holds what they share."""
