"""Frames shown on the page (the frame panel, an alert's frame in the chat) as JPEG files written once.

Given an image array, Gradio encodes it and writes it in place to a file named by the hash of its
bytes, every time it goes out. The chat goes out again with each answer's update and the frame panel
with each redraw, so the same file was being rewritten while a browser was still reading it, which
cut the download short (`ERR_CONTENT_LENGTH_MISMATCH`). Here each distinct frame is written once,
under a temporary name renamed into place, in Gradio's cache folder: Gradio then serves the file as
it is, and its `delete_cache` ages it out like its own files.
"""

from __future__ import annotations

import hashlib
import io
import os
import tempfile
from pathlib import Path

import numpy as np
from gradio.utils import get_upload_folder
from PIL import Image

JPEG_QUALITY = 85


def still(frame: np.ndarray) -> str:
    """The path of a JPEG file showing `frame` (H x W x 3, uint8), written the first time it is asked for."""
    digest = hashlib.sha256(f"{frame.shape}".encode() + np.ascontiguousarray(frame).tobytes()).hexdigest()
    folder = Path(get_upload_folder()) / f"hermes-{digest}"
    path = folder / "frame.jpg"
    if path.exists():
        # Gradio's `delete_cache` ages files by their ctime: one shown again is fresh again.
        os.utime(path)
        return str(path)
    folder.mkdir(parents=True, exist_ok=True)
    data = io.BytesIO()
    Image.fromarray(frame).save(data, format="JPEG", quality=JPEG_QUALITY)
    fd, staging = tempfile.mkstemp(dir=folder, prefix=".frame.")
    with os.fdopen(fd, "wb") as out:
        out.write(data.getvalue())
    os.replace(staging, path)
    return str(path)
