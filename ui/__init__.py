"""The HERMES Live web UI (Gradio 6): layout, event handlers and Plotly figures."""

from ui.layout import build_app, launch_options, model_banner, random_weights_banner

__all__ = ["build_app", "launch_options", "model_banner", "random_weights_banner"]
