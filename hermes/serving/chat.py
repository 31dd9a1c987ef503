"""A stream's chat: the messages shown to its viewer, safe against writes from before a reset."""

from __future__ import annotations

import threading


class Chat:
    """Chat messages (Gradio's role/content dicts) of one stream generation.

    Writes may carry the generation they belong to (an answer ticket's): once `clear` has moved
    the chat to a newer generation, such writes land nowhere, since the chat they belonged to is gone.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._messages: list[dict] = []
        self._generation = 0

    def clear(self, generation: int) -> None:
        """Drop every message and take writes of `generation` (or without one) from now on."""
        with self._lock:
            self._messages = []
            self._generation = generation

    def messages(self) -> list[dict]:
        """Copies of the messages, oldest first."""
        with self._lock:
            return [dict(m) for m in self._messages]

    def add(self, message: dict, generation: int | None = None) -> int:
        """Append a message; returns its index, for `set`, or -1 when `generation` is stale."""
        with self._lock:
            if generation is not None and generation != self._generation:
                return -1
            self._messages.append(message)
            return len(self._messages) - 1

    def set(self, index: int, message: dict, generation: int | None = None) -> None:
        """Replace the message at `index` (an answer growing token by token)."""
        with self._lock:
            if generation is not None and generation != self._generation:
                return
            if 0 <= index < len(self._messages):
                self._messages[index] = message
