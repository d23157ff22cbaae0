"""Run bookkeeping: the JSONL metrics log, the experiment trackers of `report_to` (accelerate's own:
TensorBoard, W&B, MLflow, trackio, ...), and the training progress saved as JSON inside every
checkpoint (`checkpoints.py`). The JSONL log is written whichever trackers are chosen: the card, the
comparison tables and the resumption (`truncate_after`) read it back; every number it records also
goes to the trackers through `accelerator.log` (main process only)."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

METRICS_FILE = "metrics.jsonl"
RESULTS_FILE = "eval_results.json"


@dataclass
class Progress:
    """Where training stands; saved in each checkpoint's `checkpoint.json` (never pickled)."""

    step: int = 0  # optimizer steps done
    epoch: int = 0
    batches_in_epoch: int = 0  # micro-batches of the current epoch already consumed

    def state_dict(self) -> dict:
        return asdict(self)

    def load_state_dict(self, state: dict) -> None:
        self.step, self.epoch, self.batches_in_epoch = state["step"], state["epoch"], state["batches_in_epoch"]


PROJECT = "hf-outheads"  # the W&B / trackio project and the MLflow experiment, unless their own variables say otherwise
TRACKER_RUNS_FILE = "tracker_runs.json"  # the W&B and MLflow run ids of the run in output_dir, for resuming
# accelerate's trackers (`accelerate.tracking.LOGGER_TYPE_TO_CLASS`) and the pip package each one needs
TRACKER_PACKAGES = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow", "trackio": "trackio",
                    "aim": "aim", "comet_ml": "comet-ml", "swanlab": "swanlab", "clearml": "clearml",
                    "dvclive": "dvclive"}


def report_to_names(report_to: str) -> list[str]:
    """`report_to` as transformers' Trainer takes it, checked without importing any tracker: `none`,
    `all` (every installed tracker), or tracker names separated by commas. Returns the names given
    (`["all"]` for all, `[]` for none); a ValueError names a name that is no tracker."""
    names = [name.strip() for name in report_to.split(",") if name.strip()]
    if names in ([], ["none"]):
        return []
    if names == ["all"]:
        return names
    unknown = [name for name in names if name not in TRACKER_PACKAGES]
    if unknown:
        raise ValueError(f"Option report_to={report_to!r}: {', '.join(map(repr, unknown))} is no tracker. Give none, "
                         f"all (every installed one) or a comma list of {', '.join(TRACKER_PACKAGES)}; metrics.jsonl is "
                         "written in every case.")
    return list(dict.fromkeys(names))


def chosen_trackers(report_to: str) -> list[str]:
    """The trackers `report_to` starts: `all` resolved to those installed (accelerate's
    `get_available_trackers`); a named tracker that is not installed is a ValueError naming its pip
    package."""
    from accelerate.tracking import get_available_trackers

    installed = [str(tracker) for tracker in get_available_trackers()]
    names = report_to_names(report_to)
    if names == ["all"]:
        return installed
    missing = [name for name in names if name not in installed]
    if missing:
        packages = " ".join(TRACKER_PACKAGES[name] for name in missing)
        raise ValueError(f"Option report_to={report_to!r}: {', '.join(missing)} is not installed (pip install {packages}).")
    return names


def run_name(training) -> str:
    """The run's name in every tracker: `run_name`, else the output folder's name."""
    return training.run_name or Path(training.output_dir).resolve().name


def saved_tracker_runs(output_dir) -> dict:
    """{tracker: run id} of the run in `output_dir` (`TRACKER_RUNS_FILE`); {} when there is none."""
    path = Path(output_dir) / TRACKER_RUNS_FILE
    return json.loads(path.read_text()) if path.is_file() else {}


def make_trackers(options, resumed_ids: dict | None = None) -> list:
    """accelerate's tracker objects for `report_to`, each naming the run `run_name(...)`, given to
    `Accelerator(log_with=...)`: W&B and trackio in the project of WANDB_PROJECT / TRACKIO_PROJECT
    (default `PROJECT`), MLflow in the experiment `PROJECT` (accelerate gives MLFLOW_EXPERIMENT_NAME
    and MLFLOW_RUN_ID precedence; MLFLOW_TRACKING_URI is mlflow's own), TensorBoard in
    output_dir/runs/<run name>; any other accelerate tracker with the run name as its first argument
    (and output_dir as its folder where it needs one). `resumed_ids` (a resumed run's
    `saved_tracker_runs`): W&B and MLflow continue those runs, trackio the run of the same name."""
    from accelerate.tracking import LOGGER_TYPE_TO_CLASS

    training, ids = options.training, resumed_ids or {}
    name, folder = run_name(training), Path(training.output_dir)
    trackers = []
    for tracker in chosen_trackers(training.report_to):
        cls = LOGGER_TYPE_TO_CLASS[tracker]
        if tracker == "wandb":
            continued = {"id": ids["wandb"], "resume": "allow"} if "wandb" in ids else {}
            trackers.append(cls(os.environ.get("WANDB_PROJECT", PROJECT), name=name, **continued))
        elif tracker == "mlflow":
            trackers.append(cls(PROJECT, run_name=name, run_id=ids.get("mlflow")))
        elif tracker == "trackio":
            trackers.append(cls(os.environ.get("TRACKIO_PROJECT", PROJECT), name=name,
                                resume="allow" if resumed_ids is not None else "never"))
        elif tracker == "tensorboard":
            trackers.append(cls(name, folder / "runs"))
        else:
            trackers.append(cls(name, folder) if cls.requires_logging_directory else cls(name))
    return trackers


def tracker_config(options: dict) -> dict:
    """The run's options as a tracker's config: numbers, strings and booleans as they are, anything
    else (lists, mappings, null) as JSON text, which every tracker takes."""
    return {key: value if isinstance(value, (int, float, str, bool)) else json.dumps(value)
            for key, value in options.items()}


def start_trackers(accelerator, options, config: dict, resumed_ids: dict | None) -> None:
    """Start the trackers given to the Accelerator (`make_trackers`) with `config` (the run's
    options) as their config, and keep the W&B and MLflow run ids in output_dir (`TRACKER_RUNS_FILE`)
    so that a resumed run continues them. A resumed run (`resumed_ids`: its saved ids) says which
    tracker runs it continues: W&B's and MLflow's by their ids, trackio's by the run's name,
    TensorBoard's in its folder. accelerate starts the trackers and logs on the main process only."""
    if not accelerator.log_with:
        return
    if accelerator.is_main_process:  # a tracker's files (TensorBoard's runs/) come after the mark of a run's folder
        start_log(options.training.output_dir)
    accelerator.init_trackers(PROJECT, config=tracker_config(config))
    if not accelerator.is_main_process:
        return
    ids = {}
    for tracker in accelerator.trackers:
        if tracker.name == "wandb":
            ids["wandb"] = tracker.run.id
        elif tracker.name == "mlflow":
            ids["mlflow"] = tracker.active_run.info.run_id
    if resumed_ids is not None:
        name = run_name(options.training)
        continued = []
        for tracker in accelerator.trackers:
            if tracker.name in ids and resumed_ids.get(tracker.name) == ids[tracker.name]:
                continued.append(f"the {tracker.name} run {ids[tracker.name]}")
            elif tracker.name in ("trackio", "tensorboard"):
                continued.append(f"the {tracker.name} run {name!r}")
        if continued:
            print(f"Continuing the tracker runs of {options.training.output_dir}: {', '.join(continued)}.")
    (Path(options.training.output_dir) / TRACKER_RUNS_FILE).write_text(json.dumps(ids, indent=1) + "\n")


def start_log(output_dir) -> None:
    """Create output_dir's metrics.jsonl, empty, if it has none: the mark of a run's folder
    (`safeguards.earlier_work`), made before the run's first other file there (a tokenizer trained
    here), so that a run stopped after writing that file is resumed or started afresh by the same
    command, not refused as a folder of someone else's files."""
    (Path(output_dir) / METRICS_FILE).touch()


class MetricsLog:
    """Appends one JSON object per line to output_dir/metrics.jsonl (main process only)."""

    def __init__(self, accelerator, output_dir: str):
        self.accelerator = accelerator
        self.path = Path(output_dir) / METRICS_FILE

    def truncate_after(self, step: int) -> None:
        """On resumption, forget what an interrupted run logged after its last checkpoint."""
        if self.accelerator.is_main_process and self.path.exists():
            kept = [line for line in self.path.read_text().splitlines() if json.loads(line).get("step", 0) <= step]
            self.path.write_text("".join(line + "\n" for line in kept))

    def log(self, record: dict, step: int) -> None:
        record = {"step": step, **record}
        if self.accelerator.is_main_process:
            with self.path.open("a") as handle:
                handle.write(json.dumps(record) + "\n")
        numbers = {k: v for k, v in record.items() if isinstance(v, (int, float)) and k != "step"}
        if self.accelerator.trackers:
            self.accelerator.log(numbers, step=step)


def read_metrics(output_dir) -> list[dict]:
    path = Path(output_dir) / METRICS_FILE
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
