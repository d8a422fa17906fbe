"""logging-io: host side effects that a graph replay would skip. One module per rule; shared.py holds what they share."""
