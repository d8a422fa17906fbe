"""distributed: collectives and DDP machinery in the step. One module per rule; shared.py holds what they share."""
