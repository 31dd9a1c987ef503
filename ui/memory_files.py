"""The memory file on the page: Save memory (a download), Load memory (an upload), and with a state
folder (`app.py --state-dir`) the offer to resume the viewer's last stream after a restart.

The viewer's key lives in the browser's local storage (a `gr.BrowserState`, encrypted with a secret
kept in the state folder) and reaches the server with the page's first request; the checkpoints
themselves are hermes.serving's (`CheckpointStore`, `Viewers`).
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import gradio as gr

from hermes.serving import Busy, CheckpointStore, LiveStream, MemoryFileError, QuestionError, Viewers
from ui.callbacks import Callbacks, status_text
from ui.panels import settings_values

STORAGE_KEY = "hermes-viewer"  # the page's local-storage entry holding the viewer's key
INTRO = (
    "**Memory file** · save this stream's memory as a file, or load one saved before (here, or by "
    "`python -m hermes stream --save-memory`): questions are then answered from it."
)
NO_STATE = "Checkpoints are off: start the app with `--state-dir DIR` to keep each stream's memory across restarts."


@dataclass(frozen=True)
class FilesPanel:
    """The memory file's part of the page."""

    save: gr.Button
    resume: gr.Button
    download: gr.File
    upload: gr.File
    note: gr.Markdown
    viewer: gr.BrowserState | None  # the viewer's key, with a state folder


def files_panel(store: CheckpointStore | None, secret: str | None = None) -> FilesPanel:
    """Save and load buttons, the download, the note, and (with `store`) the resume offer; the
    viewer's key in the browser's storage with `store` (encrypted with its secret) or `secret`."""
    with gr.Group(elem_id="memory-files"):
        gr.Markdown(INTRO)
        with gr.Row():
            save = gr.Button("💾 Save memory", size="sm", elem_id="save-memory")
            resume = gr.Button("↩ Resume my last stream", size="sm", visible=False, elem_id="resume-memory")
        download = gr.File(label="Saved memory (download)", interactive=False, elem_id="memory-download")
        upload = gr.File(label="Load memory", type="filepath", height=130, elem_id="load-memory")
        note = gr.Markdown("" if store is not None or secret is not None else NO_STATE, elem_id="memory-note")
    viewer = None
    if store is not None or secret is not None:
        secret = store.browser_secret() if store is not None else secret
        viewer = gr.BrowserState(None, storage_key=STORAGE_KEY, secret=secret)
    return FilesPanel(save, resume, download, upload, note, viewer)


def refused(message: str) -> tuple:
    """A file that was not loaded: the message (a warning, and in the note), the stream left as it was."""
    gr.Warning(message)
    return gr.skip(), gr.skip(), f"⚠️ {message}"


class FileCallbacks:
    """The memory file's handlers, over the app's `Callbacks` (which find each viewer's stream)."""

    def __init__(self, cb: Callbacks) -> None:
        self.cb = cb
        self.viewers: Viewers | None = cb.viewers
        self._downloads = Path(tempfile.mkdtemp(prefix="hermes-memories-"))  # Gradio serves files from the temp dir

    def hello(self, key: str | None, request: gr.Request) -> tuple[str, str, gr.Button]:
        """The page opened with the key its browser keeps: the key to keep, and the resume offer (on a
        cluster none: the key finds the stream itself, wherever it runs)."""
        session = request.session_hash or "anonymous"
        if self.viewers is None:
            return self.cb.keys.hello(session, key), "", gr.Button(visible=False)
        key, found = self.viewers.hello(session, key)
        if found is None:
            return key, "", gr.Button(visible=False)
        offer = f"A checkpoint of your last stream is here: {found.describe()}."
        return key, offer, gr.Button(visible=True)

    def save(self, request: gr.Request) -> str:
        """Save the viewer's memory and offer it as a download (the file's path)."""
        session = request.session_hash or "anonymous"
        folder = self._downloads / hashlib.sha256(session.encode()).hexdigest()[:16]
        try:
            path = self.cb.stream_of(request).files.download(folder)
        except (QuestionError, OSError, RuntimeError, TimeoutError) as exc:
            raise gr.Error(str(exc)) from exc
        return str(path)

    def load(self, path: str | None, request: gr.Request) -> tuple:
        """Start over holding the uploaded memory file; a refused file leaves the stream as it was
        (and the upload box is cleared either way, for the next file)."""
        if not path:
            raise gr.Error("Choose a memory file to load.")
        stream = self.cb.stream_of(request)
        try:
            summary = stream.files.load(path)
        except (MemoryFileError, Busy, RuntimeError, TimeoutError) as exc:
            return (*refused(str(exc).replace(path, Path(path).name)), None)
        return self._loaded(stream, f"Memory loaded from {Path(path).name}: {summary}.")

    def resume(self, request: gr.Request) -> tuple:
        """Start over holding the viewer's checkpoint."""
        stream = self.cb.stream_of(request)
        try:
            summary = self.viewers.resume(request.session_hash or "anonymous", stream.files)
        except (MemoryFileError, Busy, RuntimeError, TimeoutError) as exc:
            return (*refused(str(exc)), gr.skip())
        *shown, _ = self._loaded(stream, f"Resumed your last stream: {summary}.")
        return (*shown, gr.Button(visible=False))

    @staticmethod
    def _loaded(stream: LiveStream, note: str) -> tuple[str, list, str, None]:
        """The status line, the chat saying what was loaded, the note, and the upload box cleared."""
        at = stream.files.resumable or 0.0
        note += (
            f" Ask about it; the next Start streams its video on from {at:.0f} s into this memory (the same video "
            "goes on where it stopped), and Reset starts afresh."
        )
        stream.chat.add({"role": "assistant", "content": f"📂 {note}"})
        return status_text(stream), stream.chat.messages(), note, None

    def settings(self, request: gr.Request) -> tuple:
        """The stream's settings as the Settings controls show them (in their order: the API's)."""
        return settings_values(self.cb.stream_of(request).settings)

    def unload(self, request: gr.Request) -> None:
        """The page closed: its downloads go (its checkpoint stays, for the key its browser keeps)."""
        session = request.session_hash or "anonymous"
        shutil.rmtree(self._downloads / hashlib.sha256(session.encode()).hexdigest()[:16], ignore_errors=True)
        if self.viewers is not None:
            self.viewers.forget(session)


def wire_files(
    demo: gr.Blocks,
    files: FilesPanel,
    fcb: FileCallbacks,
    status: gr.Markdown,
    chatbot: gr.Chatbot,
    controls: dict[str, gr.components.Component],
) -> None:
    """Bind the memory file's part of the page to its handlers (in `demo`'s context); a loaded
    memory's settings show in the Settings `controls` after, so that Reset and Start keep them."""
    quick = {"concurrency_limit": None, "show_progress": "hidden"}
    shown = {"fn": fcb.settings, "outputs": list(controls.values()), "api_name": "stream_settings", **quick}
    files.save.click(fcb.save, None, files.download, api_name="save_memory", show_progress="minimal")
    loaded = [status, chatbot, files.note]
    files.upload.upload(
        fcb.load, files.upload, [*loaded, files.upload], api_name="load_memory", show_progress="minimal"
    ).then(**shown)
    # Private: an API client has no browser storage, so no key to resume by (it saves and loads instead).
    resume = {"api_visibility": "private", "show_progress": "minimal"}
    files.resume.click(fcb.resume, None, [*loaded, files.resume], **resume).then(**shown | {"api_name": False})
    if files.viewer is not None:
        demo.load(fcb.hello, files.viewer, [files.viewer, files.note, files.resume], api_visibility="private", **quick)
    demo.unload(fcb.unload)
