"""Reading published versions: the loader, TFDS, PyTorch, from a pip install."""
