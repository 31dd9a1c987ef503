"""The models this plugin gives lmms-eval: model name -> class in `hermes.eval.lmms.models.<name>`."""

AVAILABLE_MODELS = {"hermes": "HermesLMM"}
