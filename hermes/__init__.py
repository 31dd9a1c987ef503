"""HERMES Live: KV cache as hierarchical memory for streaming video understanding."""

from hermes.memory.config import HermesConfig

__all__ = ["HermesConfig"]
__version__ = "0.1.0"
