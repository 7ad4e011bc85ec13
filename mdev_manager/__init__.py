"""Node manager: discover GPUs and vGPUs, reconcile them to a declared layout."""

__version__ = "0.1.0"
