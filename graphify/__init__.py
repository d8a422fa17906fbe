"""graphify: find CUDA-graph breakers in PyTorch loops and rewrite loops into capture-and-replay form."""

__version__ = "0.1.0"
