"""cnnpar: fast convolutional-network training, from a laptop CPU to many GPUs, with measured speed-ups."""

__version__ = "0.1.0"
