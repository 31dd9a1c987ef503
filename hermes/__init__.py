"""HERMES Live: KV cache as hierarchical memory for streaming video understanding."""

from hermes.memory.cache import HermesCache
from hermes.memory.config import HermesConfig

__all__ = ["HermesCache", "HermesConfig"]
__version__ = "0.1.0"
