"""Run bookkeeping: the JSONL metrics log (plus TensorBoard when installed) and the training
progress saved as JSON inside every checkpoint (`checkpoints.py`). The JSONL log is ours because
accelerate's trackers (TensorBoard, W&B, ...) write no plain file that the card, the comparison
tables and the resumption (`truncate_after`) can read back; TensorBoard goes through `accelerator.log`."""

from __future__ import annotations

import importlib.util
import json
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


def tensorboard_available() -> bool:
    return importlib.util.find_spec("tensorboard") is not None or importlib.util.find_spec("tensorboardX") is not None


def trackers(report_to: str) -> list[str]:
    """accelerate trackers to start besides the JSONL log."""
    if report_to == "tensorboard" and not tensorboard_available():
        raise ValueError("report_to=tensorboard, but tensorboard is not installed (pip install tensorboard).")
    return ["tensorboard"] if report_to == "tensorboard" or (report_to == "auto" and tensorboard_available()) else []


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
