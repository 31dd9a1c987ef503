"""The stream runtime: a source's frames fed to a session through one driver, below every front end.

`driver.py` paces frames into chunks and hands each timed item (a question, a benchmark's question)
back once the stream has passed its time; `sources.py` opens what a stream reads: a video file, a
folder of frames, or a network URL. The command line, the evaluation harness, the toy world's bench
and the library's examples run through them; the web app's sources (`hermes.serving`) are next.
"""

from hermes.runtime.driver import TimedQuestion, parse_ask, play, replay
from hermes.runtime.sources import FileFrames, FolderFrames, NetworkFrames, open_source

__all__ = [
    "FileFrames",
    "FolderFrames",
    "NetworkFrames",
    "TimedQuestion",
    "open_source",
    "parse_ask",
    "play",
    "replay",
]
