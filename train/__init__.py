"""A containerised multi-GPU TensorFlow/Keras training template. Run `python -m train --help`."""

__version__ = "0.1.0"
