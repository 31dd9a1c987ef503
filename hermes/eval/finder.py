"""Finding a question's video under the video root, in whichever layout the benchmark's files are."""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

from hermes.eval.items import Item


class VideoFinder:
    """Find a video under the root: as written, under one of the benchmark's folders for it, with a
    known extension added (or in place of another), or by name anywhere below the root (an index
    built on first need). A folder is a video when the benchmark keeps frame folders
    (`Item.frames_fps`)."""

    def __init__(self, root: str | Path, extensions: Sequence[str] = ()) -> None:
        self.root = Path(root)
        self.extensions = tuple(extensions)
        self._by_name: dict[str, list[Path]] | None = None

    def _names(self, rel: Path) -> list[Path]:
        others = [rel.with_name(rel.name + ext) if not rel.suffix else rel.with_suffix(ext) for ext in self.extensions]
        return [rel, *(n for n in others if n != rel)]

    def find(self, item: Item) -> tuple[Path | None, str]:
        """(path, "") when found, else (None, why)."""
        rel = Path(os.path.normpath(item.video))
        names = self._names(rel)
        bases = [self.root, *(self.root / d.folder for d in item.video_dirs)]
        for base in bases:
            for name in names:
                path = name if name.is_absolute() else base / name
                if path.is_file():
                    return path, ""
                if path.is_dir():
                    if item.frames_fps is not None:
                        return path, ""
                    return None, f"{path} is a folder, not a video file"
        found = {p for name in names for p in self._index().get(name.name, []) if item.frames_fps or p.is_file()}
        if len(found) == 1:
            return found.pop(), ""
        if found:
            return None, f"{item.video} is ambiguous under {self.root}: {len(found)} files have that name"
        return None, f"video not found: {item.video} (looked under {self.root})"

    @staticmethod
    def whole(item: Item, path: Path) -> bool:
        """Whether the file found is already cut to the item's clip: it sits in one of the folders
        the benchmark keeps such clips in (lmms-eval's MVBench segments)."""
        parent = path.parent.as_posix()
        return any(d.whole and parent.endswith("/" + d.folder.strip("/")) for d in item.video_dirs)

    def _index(self) -> dict[str, list[Path]]:
        if self._by_name is None:
            self._by_name = defaultdict(list)
            if self.root.is_dir():
                for dirpath, dirs, files in os.walk(self.root):
                    for name in [*files, *dirs]:  # folders: frame folders, kept apart by `find`
                        self._by_name[name].append(Path(dirpath) / name)
        return self._by_name
