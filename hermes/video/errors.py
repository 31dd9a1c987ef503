"""Why a video file cannot be used, in words a user understands (never the decoder's internals)."""

from __future__ import annotations

import math
import os
from pathlib import Path


def clock(seconds: float) -> str:
    """A stream time as a player shows it: 0:57, 12:03, 1:02:03 (whole seconds, rounded down)."""
    s = max(0, math.floor(seconds + 1e-6))
    h, m, s = s // 3600, s // 60 % 60, s % 60
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


class VideoError(ValueError):
    """A video file cannot be used: missing, empty, not a video, corrupt, without frames or in a codec the
    decoder lacks. `reason` says why in words; the message names the file."""

    def __init__(self, path: str | os.PathLike[str], reason: str, message: str | None = None) -> None:
        self.path = str(path)
        self.reason = reason
        super().__init__(message or f"Cannot read video '{Path(path).name}': {reason}")


class VideoDamaged(VideoError):
    """Decoding stopped part-way through a file: the frames up to `good_until_s` were read, the next one
    cannot be decoded. `good_until_s` is None when not even the first frame asked for decoded; `at_s`
    is the time of the frame that failed."""

    def __init__(self, path: str | os.PathLike[str], good_until_s: float | None, at_s: float) -> None:
        self.good_until_s, self.at_s = good_until_s, at_s
        where = f"after {clock(good_until_s)}" if good_until_s is not None else f"at {clock(at_s)}"
        message = (
            f"'{Path(path).name}' is damaged {where}: the stream stopped at the last good frame, "
            "and what was read stays in memory."
        )
        super().__init__(path, f"the file is damaged {where}", message)
