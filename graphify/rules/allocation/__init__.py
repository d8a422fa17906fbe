"""in-loop-allocation: tensors built from host data inside the step. One module per rule."""
