"""A stream's chat: the messages shown to its viewer, safe against writes from before a reset.

The chat is the viewer's, so it is kept, within a bound: the last MAX_MESSAGES messages (a
question is at most 1,000 characters, an answer a few hundred), of which the last MAX_MEDIA keep
their pictures (an alert's frame); older ones keep their text. So a chat holds at most about
MAX_MESSAGES x 1.5 kB of text and MAX_MEDIA small frames, however long the stream runs.
"""

from __future__ import annotations

import threading

MAX_MESSAGES = 400
MAX_MEDIA = 20


class Chat:
    """Chat messages (Gradio's role/content dicts) of one stream generation.

    Writes may carry the generation they belong to (an answer ticket's): once `clear` has moved
    the chat to a newer generation, such writes land nowhere, since the chat they belonged to is gone.
    Indices count every message added since the last clear, so that an answer still growing can be
    replaced where it is after older messages were dropped.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._messages: list[dict] = []
        self._first = 0  # the index of the first message kept
        self._generation = 0
        self.version = 0  # changes with every write, so that a reader can tell it missed one

    def clear(self, generation: int) -> None:
        """Drop every message and take writes of `generation` (or without one) from now on."""
        with self._lock:
            self._messages = []
            self._first = 0
            self._generation = generation
            self.version += 1

    def messages(self) -> list[dict]:
        """Copies of the messages, oldest first (after a note when older ones were dropped)."""
        with self._lock:
            shown = [dict(m) for m in self._messages]
            if self._first:
                note = f"*(the {self._first:,} oldest messages are gone: the chat keeps the last {MAX_MESSAGES})*"
                shown.insert(0, {"role": "assistant", "content": note})
            return shown

    def add(self, message: dict, generation: int | None = None) -> int:
        """Append a message; returns its index, for `set`, or -1 when `generation` is stale."""
        with self._lock:
            if generation is not None and generation != self._generation:
                return -1
            self._messages.append(message)
            self._bound()
            self.version += 1
            return self._first + len(self._messages) - 1

    def set(self, index: int, message: dict, generation: int | None = None) -> None:
        """Replace the message at `index` (an answer growing token by token), unless it is gone."""
        with self._lock:
            if generation is not None and generation != self._generation:
                return
            at = index - self._first
            if 0 <= at < len(self._messages):
                self._messages[at] = message
                self._bound()
                self.version += 1

    def _bound(self) -> None:
        """Keep the last MAX_MESSAGES messages, and the pictures of the last MAX_MEDIA (lock held)."""
        if len(self._messages) > MAX_MESSAGES:
            gone = len(self._messages) - MAX_MESSAGES
            self._messages = self._messages[gone:]
            self._first += gone
        media = [i for i, m in enumerate(self._messages) if isinstance(m.get("content"), list)]
        for i in media[:-MAX_MEDIA]:
            text = next((c for c in self._messages[i]["content"] if isinstance(c, str)), "")
            self._messages[i] = {**self._messages[i], "content": text}
