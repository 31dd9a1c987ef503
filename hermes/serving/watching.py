"""A viewer's standing questions, and the alerts they fired that the page has yet to show."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable

from hermes.engine.watch import check_removable, validate_standing
from hermes.serving.view import ALERT_LIMIT, Alert


class Watchlist:
    """The standing questions of one viewer, in the order they were added: they are the viewer's,
    so they outlive a reset of the stream. Checked here, once; each memory is handed the list as it
    is (hermes.serving.memories). Thread-safe."""

    def __init__(self, max_chars: int) -> None:
        self.max_chars = max_chars
        self._lock = threading.Lock()
        self._questions: list[str] = []
        self._alerts: deque[Alert] = deque(maxlen=ALERT_LIMIT)

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

    def push_alerts(self, alerts: Iterable[Alert]) -> None:
        """Alerts that fired, for the page to show (the oldest go when too many wait)."""
        with self._lock:
            self._alerts.extend(alerts)

    def pop_alerts(self) -> list[Alert]:
        """The alerts since the last call, oldest first, each returned once."""
        with self._lock:
            out = list(self._alerts)
            self._alerts.clear()
            return out

    def clear_alerts(self) -> None:
        """Forget the alerts waiting (the stream was reset)."""
        with self._lock:
            self._alerts.clear()
