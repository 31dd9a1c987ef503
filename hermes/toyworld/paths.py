"""Where the toy world's committed files live in the repository."""

from __future__ import annotations

from hermes.models.loading import TOY2_MODEL_DIR, TOY2_SAMPLES, TOY_MODEL_DIR, TOY_SAMPLES

TOYWORLD_DIR = TOY_MODEL_DIR.parent
HELDOUT_DIR = TOYWORLD_DIR / "heldout"
MODEL_DIR = TOY_MODEL_DIR
SAMPLES_DIR = TOY_SAMPLES  # the app's toy clips, where the app reads them
MODEL2_DIR = TOY2_MODEL_DIR  # the second world's model, with its held-out set beside it
HELDOUT2_DIR = TOY2_MODEL_DIR.parent / "heldout"
SAMPLES2_DIR = TOY2_SAMPLES
