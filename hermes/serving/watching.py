"""A viewer's standing questions (the alerts they fire reach the page in the stream's view)."""

from __future__ import annotations

import threading

from hermes.engine.watch import check_removable, validate_standing


class Watchlist:
    """The standing questions of one viewer, in the order they were added: they are the viewer's,
    so they outlive a reset of the stream. Checked here, once; each memory is handed the list as it
    is (hermes.serving.memories). Thread-safe."""

    def __init__(self, max_chars: int) -> None:
        self.max_chars = max_chars
        self._lock = threading.Lock()
        self._questions: list[str] = []

    def add(self, question: str) -> list[str]:
        """Watch `question` too; the list now. WatchError for an empty, too long, repeated or fifth one."""
        with self._lock:
            self._questions.append(validate_standing(question, self._questions, self.max_chars))
            return list(self._questions)

    def remove(self, question: str) -> list[str]:
        """Stop watching `question`; the list now. WatchError when it is not watched."""
        with self._lock:
            self._questions.remove(check_removable(question, self._questions))
            return list(self._questions)

    def questions(self) -> list[str]:
        with self._lock:
            return list(self._questions)
