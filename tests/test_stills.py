"""The page's frames are JPEG files written once: showing a frame again never rewrites the file a
browser may still be reading (which cut its download short)."""

from __future__ import annotations

import numpy as np
from PIL import Image

from ui.stills import still


def test_a_frame_is_written_once_and_shown_again_from_the_same_file(tmp_path, monkeypatch):
    monkeypatch.setenv("GRADIO_TEMP_DIR", str(tmp_path))
    rng = np.random.default_rng(0)
    frame = rng.integers(0, 256, size=(48, 64, 3), dtype=np.uint8)
    path = still(frame)
    assert path.startswith(str(tmp_path)) and path.endswith(".jpg")
    with Image.open(path) as shown:
        assert shown.format == "JPEG" and shown.size == (64, 48)
    written = (tmp_path / path).stat()
    # The same frame again (another array holding it): the same file, untouched but for its times.
    again = still(frame.copy())
    assert again == path
    assert (tmp_path / again).stat().st_ino == written.st_ino
    assert (tmp_path / again).stat().st_size == written.st_size
    other = still(frame[::-1].copy())
    assert other != path
    # Nothing half-written is left beside the frames.
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file()) == ["frame.jpg", "frame.jpg"]
