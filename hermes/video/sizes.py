"""How large a decoded frame may be, and FFmpeg's decoders held to it frame by frame.

A file's header gives only the size of its first frames. Two MPEG-TS files put end to end (small
frames, then 8000 x 8000 ones) pass a check of the header, and the decoder then makes each later
frame at full size whatever size it hands over (three such frames took 1.1 GB). A PyAV decoder is
told the limit (`limit_decoder`: FFmpeg's own `max_pixels`, which refuses a frame before its
buffers are allocated), and the size is checked again at every frame (`check_pixels`); network
streams decode that way (`decode_within`). decord takes no limit, and its worker decodes ahead of
the frame asked for as far as it gets (a few hundred frames, in the background), so
`hermes.video.libav.check_frame_sizes` reads every key frame of a file with a decoder that takes
one, before decord opens the file.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

# Frames larger than this (8K UHD) are refused: the decoder holds several full-size frames at once
# whatever size it hands over (an 8000 x 8000 frame took about 1 GB), so one small file could take
# the machine's memory.
MAX_FRAME_PIXELS = 7680 * 4320


def too_large(width: int, height: int, max_pixels: int, *, later: bool = False) -> str:
    """Why frames of `width` x `height` are refused, in words; `later`: they come after smaller ones."""
    size = f"{width}x{height} ({width * height / 1e6:.1f} megapixels)"
    what = f"frames of {size} later in the video are" if later else f"its frames are {size},"
    return (
        f"{what} larger than this reader decodes (at most {max_pixels / 1e6:.1f} megapixels); "
        "scale the video down first"
    )


class TooLarge(ValueError):
    """A frame of `width` x `height` pixels is past `max_pixels`; `later`: after smaller frames of the
    same stream. `reason` says so in words."""

    def __init__(self, width: int, height: int, max_pixels: int, *, later: bool = False) -> None:
        self.width, self.height, self.max_pixels = width, height, max_pixels
        self.reason = too_large(width, height, max_pixels, later=later)
        super().__init__(self.reason)


def check_pixels(width: int, height: int, max_pixels: int | None = MAX_FRAME_PIXELS, *, later: bool = False) -> None:
    """Raise TooLarge when a `width` x `height` frame is past `max_pixels` (None: no limit)."""
    if max_pixels and width * height > max_pixels:
        raise TooLarge(width, height, max_pixels, later=later)


def limit_decoder(context: Any, max_pixels: int = MAX_FRAME_PIXELS) -> None:
    """Have the FFmpeg decoder behind a PyAV codec context refuse frames of more than `max_pixels`
    before it allocates them (its `max_pixels` option). Takes effect when the decoder opens: call it
    before the first packet is decoded."""
    context.options = {**context.options, "max_pixels": str(max_pixels)}


def decode_within(container: Any, stream: Any, max_pixels: int = MAX_FRAME_PIXELS) -> Iterator[Any]:
    """`container.decode(stream)` with every frame held to `max_pixels`: the decoder refuses a larger
    one before allocating it, and TooLarge is raised as soon as the stream's size passes the limit
    (read from the decoder after each packet, so a frame it refused is seen too) or a frame does."""
    limit_decoder(stream.codec_context, max_pixels)
    for packet in container.demux(stream):
        context = stream.codec_context
        try:
            frames = packet.decode()
        except Exception:  # some decoders refuse a frame past the limit with an error: say which it was
            check_pixels(context.width, context.height, max_pixels, later=True)
            raise
        check_pixels(context.width, context.height, max_pixels, later=True)
        for frame in frames:
            check_pixels(frame.width, frame.height, max_pixels, later=True)
            yield frame
