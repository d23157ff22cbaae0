"""`report_to` and `run_name` as Trainer takes them, through accelerate's trackers, read back with each
tracker's own reader, offline: W&B (WANDB_MODE=offline, its run file read with `wandb leet inspect`),
MLflow (a file store under the test's folder, read with `MlflowClient`), trackio (its local store,
`trackio.SQLiteStorage`) and TensorBoard (its event files, `EventAccumulator`). A tiny run of
`hf-outheads train` logs the same training losses as metrics.jsonl to all four, is resumed into the
same tracker runs, and logs once when launched as two processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

wandb = pytest.importorskip("wandb")
mlflow = pytest.importorskip("mlflow")
trackio = pytest.importorskip("trackio")
pytest.importorskip("tensorboard")

from subprocess_runs import run  # noqa: E402

from hf_outheads.training.options import parse_options  # noqa: E402
from hf_outheads.training.tracking import PROJECT, TRACKER_PACKAGES, TRACKER_RUNS_FILE  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CLI = Path(sys.executable).with_name("hf-outheads")
TRACKERS = "wandb,mlflow,trackio,tensorboard"
TINY_LM = dict(task="causal_lm", model_preset="gpt2-tiny", model_overrides={"n_embd": 32, "n_layer": 1, "n_head": 2},
               dataset_name="stdlib_docstrings", dataset_config="text", max_train_samples=120, max_eval_samples=16,
               tokenizer="bpe", tokenizer_vocab_size=300, block_size=32, per_device_train_batch_size=4,
               per_device_eval_batch_size=8, learning_rate=1e-3, dropout=0.0, logging_steps=1, max_steps=4,
               save_steps=2, sample_max_new_tokens=2, report_to=TRACKERS, run_name="R")


def tracker_env(tmp: Path) -> dict:
    """Every tracker writes under `tmp` and nothing reaches the network."""
    env = {k: v for k, v in os.environ.items() if k not in ("ACCELERATE_USE_CPU", "WANDB_PROJECT", "TRACKIO_PROJECT")
           and not k.startswith("MLFLOW_")}
    return {**env, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1",
            "WANDB_MODE": "offline", "WANDB_DIR": str(tmp), "WANDB_SILENT": "true",
            "MLFLOW_TRACKING_URI": f"file:{tmp / 'mlruns'}", "MLFLOW_ALLOW_FILE_STORE": "true",
            "TRACKIO_DIR": str(tmp / "trackio")}


def train(tmp: Path, command: list[str], env: dict | None = None, **overrides) -> subprocess.CompletedProcess:
    config = tmp / "run.yaml"
    config.write_text(yaml.safe_dump({**TINY_LM, "output_dir": str(tmp / "out"), **overrides}))
    done = run([*command, "--config", str(config)], env={**tracker_env(tmp), **(env or {})}, cwd=tmp)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    return done


def jsonl_losses(output_dir: Path) -> dict[int, float]:
    records = [json.loads(line) for line in (output_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["train_loss"] for r in records if "train_loss" in r}


def wandb_runs(tmp: Path) -> list[dict]:
    """Each offline W&B run file under `tmp`, read with W&B's own reader (`wandb leet inspect`): its run
    record, its history rows and its summary."""
    runs = []
    for path in sorted((tmp / "wandb").glob("offline-run-*/run-*.wandb")):
        inspect = [sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(path)]
        records = [json.loads(line) for line in subprocess.run(inspect, capture_output=True, text=True,
                                                               check=True).stdout.splitlines()]
        summary = json.loads(subprocess.run(inspect[:-1] + ["--summary", str(path)], capture_output=True, text=True,
                                            check=True).stdout)
        runs.append({"run": next(r["run"] for r in records if r["type"] == "run"), "summary": summary,
                     "history": [r["history"]["item"] for r in records if r["type"] == "history"]})
    return runs


def mlflow_run(tmp: Path, name: str, monkeypatch, experiment: str = PROJECT):
    """The one MLflow run of the test's file store (MLflow 3 reads a file store when allowed to)."""
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    client = mlflow.tracking.MlflowClient(f"file:{tmp / 'mlruns'}")
    experiment = client.get_experiment_by_name(experiment)
    runs = client.search_runs([experiment.experiment_id])
    assert [r.info.run_name for r in runs] == [name]
    return client, runs[0]


def trackio_losses(tmp: Path, name: str, project: str = PROJECT) -> dict[int, float]:
    done = subprocess.run([sys.executable, "-c", (
        "import json, sys, trackio; print(json.dumps(trackio.SQLiteStorage.get_runs(sys.argv[1])));"
        "print(json.dumps(trackio.SQLiteStorage.get_logs(sys.argv[1], sys.argv[2])))"), project, name],
        env={**os.environ, "TRACKIO_DIR": str(tmp / "trackio")}, capture_output=True, text=True, check=True)
    runs, logs = (json.loads(line) for line in done.stdout.splitlines()[-2:])
    assert runs == [name]
    return {log["step"]: log["train_loss"] for log in logs if "train_loss" in log}


def tensorboard_losses(folder: Path) -> list[tuple[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(folder))
    events.Reload()
    return [(event.step, event.value) for event in events.Scalars("train_loss")]


@pytest.fixture(scope="module")
def resumed_run(tmp_path_factory):
    """`hf-outheads train --report_to wandb,mlflow,trackio,tensorboard --run_name R`, stopped after its
    checkpoint at step 2 and resumed by the same command to step 4."""
    tmp = tmp_path_factory.mktemp("trackers")
    first = train(tmp, [str(CLI), "train"], stop_after_steps=2)
    second = train(tmp, [str(CLI), "train"], stop_after_steps=2)
    return tmp, first.stdout + first.stderr, second.stdout + second.stderr


def test_every_tracker_reads_back_the_losses_of_metrics_jsonl(resumed_run, monkeypatch):
    tmp, _, _ = resumed_run
    out = tmp / "out"
    losses = jsonl_losses(out)
    assert sorted(losses) == [1, 2, 3, 4]
    # W&B: one run (the resumed process continues it), its name, its history and its summary
    runs = wandb_runs(tmp)
    assert len(runs) == 2 and {r["run"]["run_id"] for r in runs} == {json.loads((out / TRACKER_RUNS_FILE).read_text())["wandb"]}
    assert {r["run"]["display_name"] for r in runs} == {"R"} and {r["run"]["project"] for r in runs} == {PROJECT}
    logged = {row["_step"]: row["train_loss"] for r in runs for row in r["history"] if "train_loss" in row}
    assert logged == pytest.approx(losses)
    results = json.loads((out / "eval_results.json").read_text())
    final = runs[-1]["summary"]
    assert final["summary"]["eval_loss"] == pytest.approx(results["eval_loss"])
    assert final["config"]["head_type"] == "tied" and json.loads(final["config"]["model_overrides"]) == TINY_LM["model_overrides"]
    # MLflow: one run named R, every step once, the options as its params
    client, found = mlflow_run(tmp, "R", monkeypatch)
    assert found.info.run_id == json.loads((out / TRACKER_RUNS_FILE).read_text())["mlflow"]
    history = client.get_metric_history(found.info.run_id, "train_loss")
    assert {m.step: m.value for m in history} == pytest.approx(losses) and len(history) == 4
    assert found.data.params["learning_rate"] == "0.001" and found.data.params["run_name"] == "R"
    assert found.data.metrics["eval_loss"] == pytest.approx(results["eval_loss"])
    # trackio: its local store, one run named R
    assert trackio_losses(tmp, "R") == pytest.approx(losses)
    # TensorBoard: output_dir/runs/R, both processes' event files
    logged = tensorboard_losses(out / "runs" / "R")
    assert [step for step, _ in logged] == [1, 2, 3, 4]
    assert dict(logged) == pytest.approx(losses, rel=1e-6)


def test_a_resumed_run_says_which_tracker_runs_it_continues(resumed_run):
    tmp, first, second = resumed_run
    ids = json.loads((tmp / "out" / TRACKER_RUNS_FILE).read_text())
    assert "Continuing the tracker runs" not in first
    said = [line for line in second.splitlines() if line.startswith("Continuing the tracker runs")]
    assert len(said) == 1, second[-3000:]
    for part in (f"the wandb run {ids['wandb']}", f"the mlflow run {ids['mlflow']}", "the trackio run 'R'",
                 "the tensorboard run 'R'"):
        assert part in said[0]


def test_two_processes_log_once_where_the_trackers_variables_say(tmp_path, monkeypatch):
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
              "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port",
              "29547", "-m", "hf_outheads.training.train"]
    named = {"WANDB_PROJECT": "two", "MLFLOW_EXPERIMENT_NAME": "two", "TRACKIO_PROJECT": "two"}
    train(tmp_path, launch, env=named, max_steps=2, save_steps=None)
    out = tmp_path / "out"
    losses = jsonl_losses(out)
    assert sorted(losses) == [1, 2]
    runs = wandb_runs(tmp_path)
    assert len(runs) == 1 and runs[0]["run"]["project"] == "two"
    assert [row["_step"] for row in runs[0]["history"] if "train_loss" in row] == [1, 2]
    client, found = mlflow_run(tmp_path, "R", monkeypatch, experiment="two")
    assert [m.step for m in client.get_metric_history(found.info.run_id, "train_loss")] == [1, 2]
    assert sorted(trackio_losses(tmp_path, "R", project="two")) == [1, 2]
    assert [step for step, _ in tensorboard_losses(out / "runs" / "R")] == [1, 2]
    assert len(list((out / "runs" / "R").glob("events.out.tfevents.*"))) == 1


def test_the_run_name_defaults_to_the_output_folders_name(tmp_path):
    from hf_outheads.training.tracking import run_name

    options = parse_options(["--output_dir", str(tmp_path / "gpt2-mos")])
    assert run_name(options.training) == "gpt2-mos"
    assert run_name(parse_options(["--run_name", "try-mos"]).training) == "try-mos"


@pytest.mark.parametrize("given,message", [
    ("wandbb", r"report_to='wandbb': 'wandbb' is no tracker. Give none, all \(every installed one\) or a comma list"),
    ("tensorboard,jsonl", r"'jsonl' is no tracker"),
])
def test_report_to_names_a_tracker_that_does_not_exist(given, message):
    with pytest.raises(ValueError, match=message):
        parse_options(["--report_to", given])


def test_a_tracker_that_is_not_installed_is_named_with_its_pip_package_before_anything_is_written(tmp_path):
    """comet_ml is one of accelerate's trackers that the test environment does not install."""
    if subprocess.run([sys.executable, "-c", "import comet_ml"], capture_output=True).returncode == 0:
        pytest.skip("comet_ml is installed here")
    done = run([str(CLI), "train", "--model_preset", "gpt2-tiny", "--tokenizer", "bpe", "--dataset_name",
                "stdlib_docstrings", "--dataset_config", "text", "--max_steps", "1", "--report_to", "tensorboard,comet_ml",
                "--output_dir", str(tmp_path / "out")], env=tracker_env(tmp_path), cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "hf-outheads train: error: Option report_to='tensorboard,comet_ml': comet_ml is not installed (pip install "
        "comet-ml)."]
    assert not (tmp_path / "out").exists()


def test_the_trackers_are_accelerates():
    from accelerate.tracking import LOGGER_TYPE_TO_CLASS

    assert set(TRACKER_PACKAGES) == set(LOGGER_TYPE_TO_CLASS)
