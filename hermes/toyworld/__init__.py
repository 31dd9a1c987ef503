"""The toy world: synthetic clips, the small model trained on them, and the memory benchmark over them."""
