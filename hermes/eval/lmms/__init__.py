"""HERMES as an lmms-eval model (optional: `pip install .[lmms-eval]`).

lmms-eval loads outside models from the packages named in LMMS_EVAL_PLUGINS: it imports
`<plugin>.models` for its AVAILABLE_MODELS and adds `<plugin>.tasks` to its task folders. So

    LMMS_EVAL_PLUGINS=hermes.eval.lmms lmms-eval --model hermes \\
        --model_args pretrained=Qwen/Qwen2.5-VL-7B-Instruct,policy=hermes,budget=4096 \\
        --tasks videomme,mvbench,ovobench

streams each task's videos through the HERMES memory and answers from it. Nothing here imports
lmms-eval except `models.hermes`, which only lmms-eval imports.
"""
