"""Run inside the lmms-eval environment by tests/test_lmms_plugin.py: the `hermes` model found in
lmms-eval's registry through LMMS_EVAL_PLUGINS, lmms-eval's evaluator running it on local tasks,
synthetic loglikelihood requests (lmms-eval 0.7.3 turns every model's loglikelihood results into
strings before a multiple-choice task scores them, so no task can carry them), and lmms-eval's own
scorers on a table of answers. Reads a JSON config, writes a JSON report.

    python tests/lmms_driver.py CONFIG.json REPORT.json
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import sys
from pathlib import Path


def lmms_verdicts(table: list[list[str]]) -> dict[str, list]:
    """What lmms-eval's Video-MME, MVBench and OVO-Bench code reads in each (response, answer). Its
    api/task.py strips a response before the task's process_results sees it."""
    from lmms_eval.tasks.mvbench.utils import mvbench_process_results
    from lmms_eval.tasks.ovobench.score_utils.score import calculate_score_backward_realtime
    from lmms_eval.tasks.videomme.utils import videomme_process_results

    out: dict[str, list] = {"videomme": [], "mvbench": [], "ovobench": []}
    for response, answer in table:
        doc = {"question_id": "q", "duration": "short", "domain": "Knowledge", "sub_category": "Astronomy",
               "task_type": "Counting Problem", "videoID": "v", "answer": answer}  # fmt: skip
        vm = videomme_process_results(doc, [response.strip()])["videomme_perception_score"]
        out["videomme"].append([vm["pred_answer"], vm["pred_answer"] == vm["answer"]])
        candidates = ["w", "x", "y", "z"]
        mv_doc = {"candidates": candidates, "answer": candidates["ABCD".index(answer)]}
        mv = mvbench_process_results(mv_doc, [response.strip()])["mvbench_accuracy"]
        out["mvbench"].append([mv["pred_answer"] != "", bool(mv["score"])])  # (counted, right)
        _, scores = calculate_score_backward_realtime(
            [{"task": "EPM", "response": response.strip(), "ground_truth": answer}]
        )
        out["ovobench"].append(bool(scores["EPM"][0]))
    return out


def refusals(make: object) -> list[str]:
    """The errors of model_args the hermes model refuses."""
    out = []
    for args in ("pretrained=tiny,colour=red", "pretrained=tiny,policy=nope"):
        try:
            make(args, {"batch_size": 1, "device": None})
            out.append("accepted")
        except ValueError as exc:
            out.append(str(exc))
    return out


def main(config_path: str, report_path: str) -> None:
    from lmms_eval.api.instance import Instance
    from lmms_eval.evaluator import simple_evaluate
    from lmms_eval.models import get_model
    from lmms_eval.tasks import TaskManager

    config = json.loads(Path(config_path).read_text())
    model = get_model("hermes").create_from_arg_string(config["model_args"], {"batch_size": 1, "device": None})
    # As lmms-eval's command line does for each plugin: its tasks folder joins the task folders.
    plugin_tasks = importlib.util.find_spec("hermes.eval.lmms.tasks").submodule_search_locations[0]
    manager = TaskManager(include_path=[plugin_tasks, config["tasks_dir"]], include_defaults=False)
    results = simple_evaluate(model=model, tasks=config["tasks"], task_manager=manager, batch_size=1)
    ask = config["loglikelihood"]  # {video, context, continuations}
    model.task_dict = {"synthetic": {"test": [{"video": ask["video"]}]}}
    requests = [
        Instance(
            "loglikelihood",
            (ask["context"], continuation, lambda doc: [doc["video"]], 0, "synthetic", "test"),
            idx=i,
            metadata={"task": "synthetic", "doc_id": 0, "repeats": 1},
        )
        for i, continuation in enumerate(ask["continuations"])
    ]
    report = {
        "versions": {name: importlib.metadata.version(name) for name in config["packages"]},
        "results": {
            task: {k: v for k, v in metrics.items() if isinstance(v, int | float)}
            for task, metrics in results["results"].items()
        },
        "samples": {
            task: [{"doc": s["doc"], "input": s["arguments"][0], "resps": s["resps"]} for s in samples]
            for task, samples in results["samples"].items()
        },
        "loglikelihood": model.loglikelihood(requests),
        "refusals": refusals(get_model("hermes").create_from_arg_string),
        "verdicts": lmms_verdicts(config["table"]),
    }
    Path(report_path).write_text(json.dumps(report, default=str))


if __name__ == "__main__":
    main(*sys.argv[1:3])
