"""host-branch: step-counter branches that change the GPU work of a step. One module per rule; shared.py holds what they share."""
