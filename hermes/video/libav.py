"""FFmpeg's own libraries in this process, through PyAV (the binding the live reader,
hermes.video.network, decodes with): what the file reader asks of FFmpeg when decord cannot do it
alone.

decord stays the file reader (fast seeking by index, frames scaled while decoding). When it cannot
open a file (a browser recording without a duration or an index, Ogg, an MPEG program stream) the
video stream is copied untouched into a fresh Matroska container (`remux`), and when it cannot
decode a frame (a damaged packet) the frames from there are decoded by FFmpeg's decoder as its own
player does (`decode_at`). Both ran FFmpeg's command-line tools before; in process they need no
`ffmpeg` binary (a pip-only install, a Space, has PyAV's wheels but no binary), start no process
per call, and hand frames over as arrays instead of raw bytes parsed back from a log. decord
takes no limit on the size of the frames it decodes: `check_frame_sizes` reads a file's key frames
first with a decoder that takes one (`hermes.video.sizes`).
"""

from __future__ import annotations

import logging
import math
import os
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

import numpy as np

from hermes.video.sizes import check_pixels, limit_decoder

log = logging.getLogger(__name__)
T = TypeVar("T")


def pyav() -> ModuleType | None:
    """The `av` module, or None where PyAV is not installed (it comes with the `video` extra)."""
    try:
        import av
    except ImportError:
        return None
    return av


def _video_stream(container):
    streams = container.streams.video
    return streams[0] if streams else None


def _from_header(path: Path, read: Callable[[Any], T], default: T) -> T:
    """`read(the file's first video stream)` with the file opened as FFmpeg opens it (its header and
    what it probes to fill it, no frame decoded), or `default` without PyAV, without a video
    stream, or when the file does not open."""
    av = pyav()
    if av is None:
        return default
    try:
        with av.open(str(path)) as container:
            stream = _video_stream(container)
            return default if stream is None else read(stream)
    except (av.error.FFmpegError, OSError, ValueError):
        return default


def check_frame_sizes(path: Path, max_pixels: int | None) -> None:
    """Raise TooLarge when a video stream of `path` has frames of more than `max_pixels` (None: no
    limit): by its header, or at any key frame, each decoded single-threaded by a decoder held to the
    limit (`limit_decoder`), so that one past it is never allocated: its size is read from the
    decoder. A stream's size changes at a key frame in the codecs the app meets (a new sequence in
    H.264, HEVC, MPEG-2, a key frame in VP8 and VP9, every frame of the intra-only codecs); a stream
    built to change it elsewhere (VP9's and AV1's reference scaling) is not seen. The cost: the key
    frames are decoded once more (about 5% of decoding the file). Checks nothing without PyAV or when
    FFmpeg cannot open the file (decord then says why it cannot)."""
    av = pyav()
    if av is None or not max_pixels:
        return
    try:
        container = av.open(str(path))
    except (av.error.FFmpegError, OSError, ValueError):
        return
    with container:
        # A stream in a codec that PyAV lacks has no decoder to read (decord lacks it too, and says so).
        streams = [s for s in container.streams.video if s.codec_context is not None]
        if not streams:  # demux() of no stream reads every stream
            return
        for stream in streams:
            check_pixels(stream.codec_context.width, stream.codec_context.height, max_pixels)
            limit_decoder(stream.codec_context, max_pixels)
            stream.codec_context.thread_count = 1  # one frame in flight: the least memory
        try:
            for packet in container.demux(*streams):
                if packet.is_keyframe:
                    _check_key_frame(av, packet, max_pixels)
        except (av.error.FFmpegError, OSError):
            pass  # the file reads no further here: nor does decord


def _check_key_frame(av: ModuleType, packet, max_pixels: int) -> None:
    """Decode a key frame under the limit; TooLarge if its stream's size passed it."""
    try:
        frames = packet.decode()
    except av.error.FFmpegError:
        frames = []  # a damaged key frame: the reader's fallbacks deal with it
    context = packet.stream.codec_context
    check_pixels(context.width, context.height, max_pixels, later=True)
    for frame in frames:
        check_pixels(frame.width, frame.height, max_pixels, later=True)


def stream_start(path: Path) -> float:
    """When the file's first video stream starts, in seconds on the container's clock (0 when
    unknown). decord counts frame times from there."""
    return _from_header(path, lambda s: 0.0 if s.start_time is None else float(s.start_time * s.time_base), 0.0)


def remux(path: Path) -> Path | None:
    """Copy the first video stream of `path`, untouched, into a new Matroska file, whose header the
    muxer writes whole (duration, index). Browser recordings (MediaRecorder's WebM has no
    duration), Ogg and MPEG program streams then open in decord. Returns the temporary file (the
    caller deletes it), or None without PyAV or when FFmpeg cannot read the file either."""
    av = pyav()
    if av is None:
        return None
    fd, name = tempfile.mkstemp(prefix="hermes-remux-", suffix=".mkv")
    os.close(fd)
    out = Path(name)
    try:
        with av.open(str(path)) as source:
            stream = _video_stream(source)
            if stream is None:
                raise ValueError("no video stream")
            with av.open(name, "w", format="matroska") as copy:
                target = copy.add_stream_from_template(stream)
                for packet in source.demux(stream):
                    if packet.dts is None:  # the demuxer's empty packet at the end
                        continue
                    packet.stream = target
                    copy.mux(packet)
        ok = out.stat().st_size > 0
    except (av.error.FFmpegError, OSError, ValueError) as e:
        log.debug("FFmpeg could not copy %s into a fresh container: %s", path, e)
        ok = False
    if not ok:
        out.unlink(missing_ok=True)
        return None
    return out


def upright_rgb(frame, size: tuple[int, int] | None) -> np.ndarray:
    """A decoded frame as (H, W, 3) uint8 RGB, turned upright as its display matrix says (a phone's
    video held on its side) and scaled to `size` (w, h, upright) when given, as decord gives frames."""
    quarter = round(frame.rotation / 90) % 4  # counter-clockwise quarter turns
    if size is not None and quarter % 2:
        size = (size[1], size[0])  # scale before turning: the same pixels, turned
    if size is None:
        image = frame.to_ndarray(format="rgb24")
    else:
        image = frame.to_ndarray(format="rgb24", width=size[0], height=size[1], interpolation="BICUBIC")
    return np.ascontiguousarray(np.rot90(image, quarter)) if quarter else image


def decode_at(
    path: Path,
    starts: Sequence[float],
    slack: Sequence[float],
    size: tuple[int, int] | None,
    *,
    seek_s: float,
    origin_s: float = 0.0,
) -> list[np.ndarray | None]:
    """The frames that start at `starts` (seconds from the video stream's start, ascending), decoded
    by FFmpeg's decoder in one pass from `seek_s` (a key frame's start, or before it),
    single-threaded, as its own player decodes: a damaged packet is dropped and the frames that
    refer to it are concealed. None for each frame the decoder does not output (its packet is
    damaged beyond repair), and for all of them without PyAV. A frame is matched to a start within
    its `slack` seconds; frames are upright and scaled to `size` (`upright_rgb`). `origin_s`: where
    the stream starts on the container's clock (`stream_start`)."""
    out: list[np.ndarray | None] = [None] * len(starts)
    av = pyav()
    if av is None or not starts:
        return out
    end = starts[-1] + slack[-1]
    try:
        with av.open(str(path)) as container:
            stream = _video_stream(container)
            # One thread: with frame threads, a damaged packet can take the frames decoded beside it.
            stream.codec_context.thread_count = 1
            limit_decoder(stream.codec_context)
            if math.isfinite(seek_s + origin_s):  # broken timestamps: from the start, as FFmpeg's player
                container.seek(int((seek_s + origin_s) / stream.time_base), stream=stream, backward=True)
            for packet in container.demux(stream):
                try:
                    frames = packet.decode()
                except av.error.InvalidDataError:
                    continue  # a damaged packet: FFmpeg's player drops it and goes on
                for frame in frames:
                    if frame.pts is None:
                        continue
                    t = float(frame.pts * stream.time_base) - origin_s
                    if t > end:
                        return out
                    k = min(range(len(starts)), key=lambda i: abs(starts[i] - t))
                    if abs(starts[k] - t) <= slack[k] and out[k] is None:
                        out[k] = upright_rgb(frame, size)
    except (av.error.FFmpegError, OSError, ValueError, OverflowError) as e:
        log.debug("FFmpeg stopped decoding %s: %s", path, e)
    return out
