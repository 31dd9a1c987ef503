"""Decoding speed: H.264 and VP9, decord 0.6.0 against its maintained fork, threaded and single-threaded.

Two clips as a phone and a browser write them (ffmpeg: H.264, and VP9 at a target bitrate in
realtime mode, as MediaRecorder does), 640x480 at 30 fps, and H.264 at 96x64, whose RGB rows FFmpeg
pads on processors with AVX-512 (decord's batches then fail). For each decord given with --decord
(each measured in its own process, with its folder first on the path), and each clip:

- decord alone: every frame through `get_batch`, 16 at a time, with FFmpeg's threads
  (`num_threads=0`) and single-threaded (`num_threads=1`);
- the app's reader: `hermes.video.decoding.VideoFile.frames` on an open file, a frame at a time,
  every frame and sampled at 1 fps (frames handed out per second), with the threads it settled on
  (FFmpeg's, or one once a frame failed with them), and the time to open a file (index and first
  frame).

Frames per second are the best of --repeats runs, the ways of reading a clip taking turns (so that a
change in the machine's load reaches them alike). The ratios at the end say whether H.264 keeps its
speed in the app's reader, a frame at a time, against decord's batches with threads, and what VP9
and the 96x64 clip get.

    python scripts/decode_bench.py --decord 0.6.0= --decord 3.4.0=/path/to/decord2-target
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BATCH = 16
KEEP_TARGET = 0.9  # H.264 frames/s in the app's reader against decord alone with threads, at least

CLIPS = {
    "h264": ("h264.mp4", "640x480", ["-c:v", "libx264", "-preset", "veryfast", "-pix_fmt", "yuv420p"]),
    "vp9": ("vp9.webm", "640x480", ["-c:v", "libvpx-vp9", "-deadline", "realtime", "-cpu-used", "8", "-b:v", "1M"]),
    "h264 96x64": ("narrow.mp4", "96x64", ["-c:v", "libx264", "-preset", "veryfast", "-pix_fmt", "yuv420p"]),
}


def make_clips(root: Path, seconds: float) -> dict[str, Path]:
    sys.path.insert(0, str(ROOT))
    from hermes.video.clips import ffmpeg_path

    out = {}
    for codec, (name, size, args) in CLIPS.items():
        path = root / name
        source = f"testsrc2=size={size}:rate=30:duration={seconds}"
        cmd = [ffmpeg_path(), "-nostdin", "-v", "error", "-y", "-f", "lavfi", "-i", source, *args, str(path)]
        subprocess.run(cmd, check=True)
        out[codec] = path
    return out


def best_fps(runs: dict[str, Callable[[], int]], repeats: int) -> dict[str, float | None]:
    """Frames per second of each `run()` (which returns a frame count), best of `repeats`; None if it
    fails. The runs take turns, so that a change in the machine's load reaches them all alike."""
    best: dict[str, float | None] = {name: 0.0 for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            if best[name] is None:
                continue
            start = time.perf_counter()
            try:
                frames = run()
            except Exception:
                best[name] = None
                continue
            best[name] = max(best[name] or 0.0, frames / (time.perf_counter() - start))
    return best


def decord_alone(decord, path: str, threads: int) -> int:
    """Every frame of `path` through decord's `get_batch`, BATCH at a time; the frame count."""
    vr = decord.VideoReader(path, ctx=decord.cpu(0), num_threads=threads)
    n = len(vr)
    for b in range(0, n, BATCH):
        vr.get_batch(list(range(b, min(n, b + BATCH)))).asnumpy()
    return n


def app_frames(video, fps: float | None) -> int:
    """The frames of an open VideoFile at `fps` (None: every frame), through the app's reader."""
    return sum(1 for _ in video.frames(fps))


def app_open(path: str) -> int:
    """Open `path` as the app does (index, first frame); counts as one frame, for best_fps."""
    from hermes.video.decoding import VideoFile

    VideoFile(path).close()
    return 1


def child(clips: dict[str, str], repeats: int) -> None:
    """Measure in this process (the decord on its path) and print one JSON line."""
    sys.path.insert(0, str(ROOT))
    import decord

    decord.logging.set_level(decord.logging.QUIET)
    from hermes.video.decoding import VideoFile  # imported before any timing

    result: dict = {"decord": decord.__version__, "clips": {}}
    for codec, path in clips.items():
        with VideoFile(path) as video:
            runs = {
                "threaded": partial(decord_alone, decord, path, 0),
                "single": partial(decord_alone, decord, path, 1),
                "app_open": partial(app_open, path),
                "app_every": partial(app_frames, video, None),
                "app_1fps": partial(app_frames, video, 1.0),
            }
            fps = best_fps(runs, repeats)
            opens = fps.pop("app_open")
            result["clips"][codec] = {
                **fps,
                "app_open_ms": None if opens is None else 1000.0 / opens,
                "app_threads": "FFmpeg's" if video.threaded else "one",
            }
    print(json.dumps(result))


def measure(label: str, folder: str, clips: dict[str, Path], repeats: int) -> dict:
    env = dict(os.environ)
    if folder:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (folder, env.get("PYTHONPATH", "")) if p)
    arg = json.dumps({k: str(v) for k, v in clips.items()})
    cmd = [sys.executable, __file__, "--child", arg, "--repeats", str(repeats)]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True)
    return {"label": label, **json.loads(done.stdout.splitlines()[-1])}


def fmt(fps: float | None) -> str:
    return "fails" if fps is None else f"{fps:,.0f}"


def report(results: list[dict], seconds: float) -> None:
    print(f"Decoding at 30 fps, {seconds:g} s clips ({int(seconds * 30)} frames), frames/s, best of runs")
    print(f"on {os.cpu_count()} CPU(s):\n")
    print(
        "| decord | clip | alone, batches, threads | alone, batches, 1 thread | app's reader, every frame | "
        "app's reader, sampled at 1 fps | app's reader's threads | app's open (ms) |"
    )
    print("|---|---|---:|---:|---:|---:|---|---:|")
    for r in results:
        for codec, c in r["clips"].items():
            opened = "fails" if c["app_open_ms"] is None else f"{c['app_open_ms']:.0f}"
            print(
                f"| {r['decord']} | {codec} | {fmt(c['threaded'])} | {fmt(c['single'])} | {fmt(c['app_every'])} | "
                f"{fmt(c['app_1fps'])} | {c['app_threads']} | {opened} |"
            )
    print()
    before = results[0]["clips"]
    for r in results:
        h264, vp9 = r["clips"]["h264"], r["clips"]["vp9"]
        if before["h264"]["threaded"] and h264["app_every"]:
            ratio = h264["app_every"] / before["h264"]["threaded"]
            verdict = "met" if ratio >= KEEP_TARGET else "missed"
            print(
                f"- decord {r['decord']}: H.264 in the app's reader / decord {results[0]['decord']} alone with "
                f"threads (before): {ratio:.2f}x (target >= {KEEP_TARGET}: {verdict})"
            )
        was = fmt(before["vp9"]["threaded"])
        print(f"- decord {r['decord']}: VP9 in the app's reader {fmt(vp9['app_every'])} frames/s (before: {was})")
        narrow = r["clips"]["h264 96x64"]
        print(
            f"- decord {r['decord']}: H.264 at 96x64 in the app's reader {fmt(narrow['app_every'])} frames/s "
            f"(decord's batches alone: {fmt(narrow['threaded'])}, with FFmpeg's threads)"
        )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--decord",
        action="append",
        metavar="LABEL=FOLDER",
        help="a decord to measure: LABEL=FOLDER puts FOLDER (a pip --target folder) first on the path; "
        "LABEL= uses the installed one. The first is 'before'. Default: the installed one",
    )
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(json.loads(args.child), args.repeats)
        return
    with tempfile.TemporaryDirectory(prefix="decode-bench-") as tmp:
        clips = make_clips(Path(tmp), args.seconds)
        results = []
        for spec in args.decord or ["installed="]:
            label, _, folder = spec.partition("=")
            results.append(measure(label, folder, clips, args.repeats))
    report(results, args.seconds)


if __name__ == "__main__":
    main()
