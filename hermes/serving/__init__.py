"""Serving many viewers: stream settings, sources, live streams, the model worker, admission.

The names below are what the UI (ui/, app.py) uses; it imports nothing from the layers under
serving, so the types it draws from (snapshots, tiers, errors) are re-exported here.
"""

from hermes.engine.methods import ATTENTION, BUDGET, HOST, PolicySpec, policy_help, policy_names
from hermes.engine.persist import MemoryFileError
from hermes.engine.session import QuestionError
from hermes.engine.watch import MAX_STANDING, WatchCheck, WatchError
from hermes.memory.snapshot import LayerSnapshot, MemorySnapshot
from hermes.memory.tiers import Tier
from hermes.models.base import VideoLM
from hermes.runtime.network import NetworkNumbers
from hermes.runtime.settings import (
    COMPARE_POLICIES,
    MAX_COMPARED,
    SETTING_BOUNDS,
    SPEEDS,
    Bound,
    StreamSettings,
    layer_tiers,
    setting_bounds,
)
from hermes.serving.admission import Busy
from hermes.serving.answers import AnswerEvent, AnswerTicket, TooManyQuestions
from hermes.serving.checkpoints import CheckpointStore, PageKeys, Viewers
from hermes.serving.live import LiveStream
from hermes.serving.model import (
    AUTO_DTYPE_HELP,
    DEFAULT_MODEL,
    FALLBACK_MODEL,
    keep_up_hint,
    load_model_or_fallback,
    requested_model,
)
from hermes.serving.registry import DEFAULT_LEASE_S, DEFAULT_MAX_PREPARING, StreamRegistry
from hermes.serving.samples import Sample, Suggestion, bundled_samples, suggestions_markdown
from hermes.serving.state import StreamState
from hermes.serving.view import Alert, AttentionLayers, ChunkRecord, FrameTokens, LiveView, StreamStatus, WatchPoint
from hermes.video.decoding import VideoError
from hermes.video.frames_folder import unpack_frames
from hermes.video.network import StreamError
from hermes.video.urls import LIVE_SCHEMES, UrlPolicy, UrlRefused

__all__ = [
    "ATTENTION",
    "AUTO_DTYPE_HELP",
    "BUDGET",
    "COMPARE_POLICIES",
    "DEFAULT_LEASE_S",
    "DEFAULT_MAX_PREPARING",
    "DEFAULT_MODEL",
    "FALLBACK_MODEL",
    "HOST",
    "LIVE_SCHEMES",
    "MAX_COMPARED",
    "MAX_STANDING",
    "SETTING_BOUNDS",
    "SPEEDS",
    "Alert",
    "AnswerEvent",
    "AnswerTicket",
    "AttentionLayers",
    "Bound",
    "Busy",
    "CheckpointStore",
    "ChunkRecord",
    "FrameTokens",
    "LayerSnapshot",
    "LiveStream",
    "LiveView",
    "MemoryFileError",
    "MemorySnapshot",
    "NetworkNumbers",
    "PageKeys",
    "PolicySpec",
    "QuestionError",
    "Sample",
    "StreamError",
    "StreamRegistry",
    "StreamSettings",
    "StreamState",
    "StreamStatus",
    "Suggestion",
    "Tier",
    "TooManyQuestions",
    "UrlPolicy",
    "UrlRefused",
    "VideoError",
    "VideoLM",
    "Viewers",
    "WatchCheck",
    "WatchError",
    "WatchPoint",
    "bundled_samples",
    "keep_up_hint",
    "layer_tiers",
    "load_model_or_fallback",
    "policy_help",
    "policy_names",
    "requested_model",
    "setting_bounds",
    "suggestions_markdown",
    "unpack_frames",
]
