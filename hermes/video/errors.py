"""Why a video file cannot be used, in words a user understands (never the decoder's internals)."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
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


@dataclass(frozen=True, slots=True)
class Skipped:
    """`frames` frames in a row, the first at `at_s`, that the decoder could not decode: the stream
    went on at the next frame that decodes, as a player does."""

    at_s: float
    frames: int

    def __str__(self) -> str:
        return f"{self.frames} frame{'s' if self.frames != 1 else ''} could not be decoded at {clock(self.at_s)}"


def skipped_summary(skips: Sequence[Skipped]) -> str | None:
    """The frames a stream skipped, in one line: the one skip as it reads, or the total and where
    (None when none were skipped)."""
    if not skips:
        return None
    if len(skips) == 1:
        return str(skips[0])
    where = ", ".join(clock(s.at_s) for s in skips[:5]) + (", ..." if len(skips) > 5 else "")
    return f"{sum(s.frames for s in skips)} frames could not be decoded (at {where})"
