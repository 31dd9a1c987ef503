"""The stream runtime: a source's frames fed to a session, below every front end.

`settings.py` is the one record of what a stream is built with (`StreamSettings`, with the bounds
a viewer is held to). Offline, `sources.py` opens what a stream reads (a video file, a folder of
frames, a network URL) and `driver.py` paces its frames into chunks and hands back each timed item
(a question, a benchmark's question) once the stream has passed its time: the command line, the
evaluation harness, the toy world's bench and the library's examples run through them. Live,
`readers.py` and `network.py` read a file, a folder, webcam frames or a network stream on their own
threads, paced by a play clock, and `feed.py` holds a stream's reader and pace: the web app's
streams run on them (`hermes.serving` adds the model thread, admission and the page's views).
"""

from hermes.runtime.driver import TimedQuestion, parse_ask, play, replay
from hermes.runtime.settings import SPEEDS, StreamSettings
from hermes.runtime.sources import FileFrames, FolderFrames, NetworkFrames, open_source

__all__ = [
    "SPEEDS",
    "FileFrames",
    "FolderFrames",
    "NetworkFrames",
    "StreamSettings",
    "TimedQuestion",
    "open_source",
    "parse_ask",
    "play",
    "replay",
]
