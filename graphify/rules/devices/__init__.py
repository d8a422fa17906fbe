"""cross-device: host-to-device copies of per-step data. One module per rule; shared.py holds what they share."""
