"""The training script's checkpoints and launches: atomic checkpoints, resuming without
unpickling, foreign checkpoints, stop_after_steps, accumulation, option checks, processes.
In process (tiny runs of about a second) except the launches that need several processes."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import sys
import time
from pathlib import Path

import pytest
import torch
from accelerate import Accelerator
from accelerate.state import AcceleratorState, GradientState

from hf_outheads import OutHeadsConfig, OutHeadsForCausalLM
import subprocess_runs
from tiny import tiny_config
from hf_outheads.training import checkpoints
from hf_outheads.training.evaluation import evaluate_perplexity
from hf_outheads.training.launching import has_accelerator
from hf_outheads.training.loop import NonFiniteWatch, window_step
from hf_outheads.training.options import RunOptions, parse_options
from hf_outheads.training.run import training_function

ROOT = Path(__file__).resolve().parents[1]
TINY = dict(task="causal_lm", model_preset="gpt2-tiny", model_overrides={"n_embd": 32, "n_layer": 1, "n_head": 2},
            dataset_name="stdlib_docstrings", dataset_config="text", max_train_samples=60, max_eval_samples=10,
            tokenizer="bpe", tokenizer_vocab_size=300, block_size=32, per_device_train_batch_size=4,
            per_device_eval_batch_size=8, learning_rate=1e-3, dropout=0.0, logging_steps=2, report_to="none",
            max_steps=4, save_steps=2, save_total_limit=1)


def run(output_dir, **overrides):
    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    return training_function(RunOptions.from_flat({**TINY, "output_dir": str(output_dir), **overrides}))


def interrupted_run(tmp_path, **overrides):
    out = tmp_path / "out"
    assert run(out, stop_after_steps=2, **overrides) == {"interrupted": True, "step": 2}
    return out, out / "checkpoints" / "checkpoint_2"


class Planted:
    """Unpickling it writes a marker file."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return exec, (f"open({self.marker!r}, 'w').write('ran')",)


def test_rerunning_an_interrupted_command_finishes_the_run(tmp_path, capsys):
    out, _ = interrupted_run(tmp_path)
    results = run(out, stop_after_steps=2)  # the same command again
    assert "eval_perplexity" in results and (out / "model.safetensors").is_file()
    assert "Resumed from" in capsys.readouterr().out
    assert json.loads((out / "tokenizer_config.json").read_text())["model_max_length"] == 512  # gpt2-tiny positions


def test_a_save_killed_half_way_loses_nothing_and_blocks_no_rerun(tmp_path, monkeypatch):
    out, first = interrupted_run(tmp_path)
    original = Accelerator.save_state

    def killed(self, output_dir=None, **kwargs):
        (Path(output_dir) / "optimizer.bin").write_bytes(b"half")
        raise KeyboardInterrupt  # as if the process died during the save

    monkeypatch.setattr(Accelerator, "save_state", killed)
    with pytest.raises(KeyboardInterrupt):
        run(out, stop_after_steps=3, save_steps=1)  # save_total_limit 1
    monkeypatch.setattr(Accelerator, "save_state", original)
    assert checkpoints.checkpoint_to_resume(out, "auto") == first and (first / "model.safetensors").is_file()
    (out / "checkpoints" / "checkpoint_9").mkdir()  # half-written, never completed: not resumed
    results = run(out)
    assert "eval_perplexity" in results
    assert [p.name for p in checkpoints.complete_checkpoints(out)] == ["checkpoint_4"]  # pruned after the rename


@pytest.mark.parametrize("planted", ["custom_checkpoint_0.pkl", "optimizer.bin"])
def test_resuming_never_unpickles_code_planted_in_the_checkpoint(tmp_path, planted):
    out, checkpoint = interrupted_run(tmp_path)
    assert not list(checkpoint.glob("custom_checkpoint_*"))  # progress is JSON
    marker = tmp_path / "marker"
    torch.save(Planted(marker), checkpoint / planted)
    with pytest.raises(ValueError, match="custom_checkpoint_0.pkl|refused, not unpickled"):
        run(out)
    assert not marker.exists()


def test_a_checkpoint_of_another_model_is_refused_naming_both_heads(tmp_path):
    out, _ = interrupted_run(tmp_path)
    with pytest.raises(ValueError, match=r"head 'tied'.*head 'mos'.*--resume never.*--output_dir"):
        run(out, head_type="mos")
    assert "eval_perplexity" in run(out, head_type="mos", resume="never")


def frozen_window_parts(model):
    """A fresh CPU Accelerator accumulating 2 micro-batches, and an SGD step at learning rate 0 that
    keeps the window's gradients (no zeroing), to compare them with one batch's."""
    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    optimizer.zero_grad = lambda: None
    return accelerator, optimizer, scheduler


def test_accumulated_loss_is_the_token_mean_over_the_whole_window():
    torch.manual_seed(0)
    model = OutHeadsForCausalLM(OutHeadsConfig(text_config=tiny_config("llama"), head_type="linear"))
    ids = torch.randint(3, 99, (4, 9), generator=torch.Generator().manual_seed(0))
    labels = ids.clone()
    labels[:2, :7] = -100  # the first micro-batch has far fewer label tokens than the second
    model(input_ids=ids, labels=labels).loss.backward()
    expected = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    accelerator, optimizer, scheduler = frozen_window_parts(model)
    options = RunOptions.from_flat({"max_grad_norm": None})
    window = [{"input_ids": ids[:2], "labels": labels[:2]}, {"input_ids": ids[2:], "labels": labels[2:]}]
    loss, _ = window_step(accelerator, model, optimizer, scheduler, window, options, NonFiniteWatch(accelerator.device))
    assert float(loss) == pytest.approx(model(input_ids=ids, labels=labels).loss.item(), rel=1e-5)
    for name, param in model.named_parameters():
        torch.testing.assert_close(param.grad, expected[name], msg=name)


@pytest.mark.parametrize("head", ["linear", "mos"])
def test_micro_batches_accumulated_through_accelerate_train_as_one_batch_as_large(head):
    """N micro-batches per optimizer step (`accelerator.accumulate`, N = gradient_accumulation_steps)
    train as one batch N times larger: the same losses and weights after two steps, label counts
    unequal across micro-batches."""
    ids = torch.randint(3, 99, (8, 9), generator=torch.Generator().manual_seed(0))
    labels = ids.clone()
    labels[:2, :6] = -100
    options = RunOptions.from_flat({"max_grad_norm": 1.0})
    runs = {}
    for accumulation in (1, 4):
        torch.manual_seed(0)
        head_options = {"latent_dropout": 0.0} if head == "mos" else {}
        model = OutHeadsForCausalLM(OutHeadsConfig(text_config=tiny_config("llama"), head_type=head, head_options=head_options))
        AcceleratorState._reset_state(True)
        GradientState._reset_state()
        accelerator = Accelerator(cpu=True, gradient_accumulation_steps=accumulation)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
        model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
        window = [{"input_ids": i, "labels": l} for i, l in zip(ids.split(8 // accumulation), labels.split(8 // accumulation))]
        watch = NonFiniteWatch(accelerator.device)
        losses = [float(window_step(accelerator, model, optimizer, scheduler, window, options, watch)[0]) for _ in range(2)]
        runs[accumulation] = losses, {k: v.detach().clone() for k, v in model.state_dict().items()}
    (one, one_state), (four, four_state) = runs[1], runs[4]
    assert four == pytest.approx(one, abs=1e-5) and one[1] != one[0]
    for name, value in one_state.items():
        torch.testing.assert_close(four_state[name], value, atol=1e-5, rtol=1e-5, msg=name)


@pytest.mark.parametrize("flags,message", [
    (["--block_size", "1"], r"block_size must be an integer >= 2, got 1"),
    (["--max_steps", "0"], r"max_steps must be an integer >= 1, got 0"),
    (["--max_steps", "2.5"], r"max_steps must be an integer >= 1, got 2.5"),
    (["--tokenizer", "bpe", "--tokenizer_vocab_size", "100"], r"tokenizer_vocab_size=100 is below the byte-level BPE alphabet: use at least 260"),
    (["--head_type", "softmaxx"], r"Unknown head type 'softmaxx'. Valid head types: \['bilinear'"),
    (["--head_type", "drill", "--head_options", "{depth: two}"], r"Head 'drill': option 'depth' must be an integer >= 0, got 'two'"),
    (["--head_type", "drill", "--head_options", "{dept: 2}"], r"Unknown option\(s\) \['dept'\] for head 'drill'"),
    (["--head_type", "drill", "--head_options_by_head", "{drill: {dropout: 2}}"], r"Head 'drill': option 'dropout' must be in \[0, 1\)"),
])
def test_bad_options_fail_when_parsed_naming_the_option(flags, message):
    with pytest.raises(ValueError, match=message):
        parse_options(flags)


def test_data_errors_come_before_the_tokenizer_is_trained(tmp_path):
    with pytest.raises(ValueError, match=r"Column\(s\) \['body'\] not found; the dataset has \['text'"):
        run(tmp_path / "a", text_column="body")
    assert not (tmp_path / "a" / "tokenizer.json").exists()
    (tmp_path / "train.txt").write_text("")
    (tmp_path / "validation.txt").write_text("some text\n")
    files = {"train": str(tmp_path / "train.txt"), "validation": str(tmp_path / "validation.txt")}
    with pytest.raises(ValueError, match=r"The 'train' split is empty"):
        run(tmp_path / "b", dataset_name=None, data_files=files)


def test_an_evaluation_over_no_token_is_an_error():
    AcceleratorState._reset_state(True)
    accelerator = Accelerator(cpu=True)
    model = OutHeadsForCausalLM(OutHeadsConfig(text_config=tiny_config("llama"), head_type="tied"))
    batches = [{"input_ids": torch.tensor([[5, 6]]), "labels": torch.tensor([[-100, -100]])}]
    with pytest.raises(ValueError, match="0 label tokens"):
        evaluate_perplexity(accelerator, model, batches, "causal_lm")


def launch_command(tmp_path, launch_args, name, env=None, **overrides) -> tuple[list[str], dict]:
    """(`accelerate launch ... -m hf_outheads.training.train --config <name>.yaml`, its environment): a tiny run into
    tmp_path/<name> unless `output_dir` is given."""
    import yaml

    config = tmp_path / f"{name}.yaml"
    config.write_text(yaml.safe_dump({**TINY, "output_dir": str(tmp_path / name), "max_steps": None,
                                      "num_train_epochs": 1, "save_steps": None, **overrides}))
    env = {**{k: v for k, v in os.environ.items() if k != "ACCELERATE_USE_CPU"}, **(env or {}), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "accelerate.commands.launch", *launch_args, "--num_machines", "1",
               "--mixed_precision", "no", "--dynamo_backend", "no", "-m", "hf_outheads.training.train",
               "--config", str(config)]
    return command, env


def launch(tmp_path, launch_args, name, env=None, returncode=0, **overrides):
    command, env = launch_command(tmp_path, launch_args, name, env, **overrides)
    done = subprocess_runs.run(command, env=env, cwd=ROOT)
    assert done.returncode == returncode, done.stderr[-4000:]
    if returncode:
        return None, done.stderr
    start = json.loads((tmp_path / name / "metrics.jsonl").read_text().splitlines()[0])
    return start, done.stderr


def test_the_documented_two_process_command_starts_two_cpu_processes_and_counts_their_epochs(tmp_path):
    readme = (ROOT / "training" / "README.md").read_text()
    assert "accelerate launch --multi_gpu --num_processes 2 hf_outheads/training/train.py" in readme
    one, _ = launch(tmp_path, ["--num_processes", "1"], "one")
    two, _ = launch(tmp_path, ["--multi_gpu", "--num_processes", "2", "--main_process_port", "29541"], "two")
    assert (one["num_processes"], two["num_processes"]) == (1, 2)
    assert two["max_steps"] == -(-one["max_steps"] // 2)  # one epoch: half the batches per process


@pytest.mark.skipif(has_accelerator(), reason="a machine with an accelerator shards with FSDP")
def test_the_documented_fsdp2_launch_on_a_cpu_stops_instead_of_training_unsharded(tmp_path):
    """accelerate's Accelerator runs FSDP on accelerators only: on a CPU the launch would train
    every process unsharded; train.py stops before training, saying why and what to do."""
    _, stderr = launch(tmp_path, ["--config_file", str(ROOT / "training" / "accelerate_fsdp2.yaml"), "--num_processes",
                                  "2", "--main_process_port", "29543"], "fsdp", returncode=1, max_steps=1)
    said = [line for line in stderr.splitlines() if line.startswith("train.py: error:")]
    assert said == [line for line in said if "The accelerate config asks for FSDP sharding, but accelerate runs FSDP "
                    "on GPUs" in line] and len(said) == 1, stderr[-3000:]  # once, from the first process
    assert "Nothing was trained" in said[0] and "training/accelerate_zero3.yaml" in said[0]
    assert not (tmp_path / "fsdp").exists()  # stopped before the output folder is made


@pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None,
                    reason="DeepSpeed is not installed (pip install 'hf_outheads[deepspeed]')")
def test_the_documented_zero3_launch_shards_on_a_cpu_and_saves_a_loadable_model(tmp_path):
    """train.py under training/accelerate_zero3.yaml on 2 CPU processes (DeepSpeed's CPU
    accelerator): a ZeRO-3 run with gradient accumulation whose gathered weights load back. A Llama
    preset with mos: built with its backbone partitioned (accelerate activates transformers'
    zero.Init), initialised on gathered weights (a padding row, identity latent maps)."""
    from hf_outheads import OutHeadsForCausalLM

    start, _ = launch(tmp_path, ["--config_file", str(ROOT / "training" / "accelerate_zero3.yaml"), "--num_processes",
                                 "2", "--main_process_port", "29545"], "zero3", env={"DS_ACCELERATOR": "cpu"},
                      num_train_epochs=None, max_steps=2, gradient_accumulation_steps=2, model_preset="llama-tiny",
                      model_overrides={}, head_type="mos")
    assert start["num_processes"] == 2 and start["max_steps"] == 2
    assert start["parameters"] > start["head_parameters"] > 0  # full sizes of the partitioned parameters
    model = OutHeadsForCausalLM.from_pretrained(tmp_path / "zero3")
    assert sum(p.numel() for p in model.parameters()) == start["parameters"]


def test_a_launch_that_gets_fewer_processes_than_asked_warns(tmp_path):
    start, stderr = launch(tmp_path, ["--num_processes", "2"], "fewer", max_steps=1, max_train_samples=20)
    assert start["num_processes"] == 1
    assert "The launch asked for 2 processes but this run has 1" in stderr and "--multi_gpu" in stderr


def test_a_hung_run_fails_with_the_stacks_of_its_processes_and_leaves_none_behind():
    """The launcher starts a worker in a session of its own (as torchrun does) and both hang."""
    worker = "import time; time.sleep(600.125)"  # a marker no other process has
    launcher = ("import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', %r], start_new_session=True); "
                "time.sleep(600)" % worker)
    with pytest.raises(pytest.fail.Exception) as failure:
        subprocess_runs.run([sys.executable, "-c", launcher], timeout=3, grace=2)
    message = str(failure.value)
    assert "still ran after 3 s" in message and message.count("Current thread") >= 2, message  # both stacks
    left = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            left += [cmdline] if b"600.125" in cmdline.read_bytes() else []
        except OSError:
            pass
    assert not left


def test_resuming_a_finished_run_says_so_and_its_tokenizer_is_reused_cleanly(tmp_path, capsys):
    """The same command again, told to overwrite, resumes the last checkpoint of a finished run: one
    line says nothing is trained. The tokenizer it reloads tokenises whole documents without the length warning,
    and is saved without load-time kwargs, its model_max_length the model's positions."""
    from transformers.testing_utils import CaptureLogger
    from transformers.utils import logging

    out = tmp_path / "out"
    run(out)
    capsys.readouterr()
    with CaptureLogger(logging.get_logger("transformers.tokenization_utils_base")) as log:
        again = run(out, overwrite_output_dir=True)  # a finished model is kept unless told otherwise
    printed = capsys.readouterr().out
    assert f"The run in {out} had already finished (step 4 of 4): nothing is trained" in printed
    assert "eval_perplexity" in again
    assert "Token indices sequence length is longer" not in log.out
    saved = json.loads((out / "tokenizer_config.json").read_text())
    assert not {"is_local", "local_files_only"} & set(saved), saved
    assert saved["model_max_length"] == 512  # gpt2-tiny's n_positions


def test_a_finished_model_is_kept_unless_the_run_is_told_to_overwrite_it(tmp_path, capsys):
    """transformers' Trainer convention: a run into a folder that holds a finished model (or files of
    no run) is refused before anything is written; --overwrite_output_dir true lets it replace them."""
    from hf_outheads.training.safeguards import EarlierWork
    from hf_outheads.training.train import main

    out = tmp_path / "out"
    run(out)
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    for resume in ("auto", "never"):
        with pytest.raises(EarlierWork, match=rf"{out} holds the finished model of an earlier run: this run would "
                                              r"replace its weights, card, metrics and checkpoints. Keep it with "
                                              r"another --output_dir, or replace it with --overwrite_output_dir true."):
            run(out, resume=resume)
    argv = [f"--{k}={json.dumps(v) if isinstance(v, dict) else v}" for k, v in TINY.items()] + [f"--output_dir={out}"]
    AcceleratorState._reset_state(True)
    with pytest.raises(SystemExit, match=r"^train.py: error: .* holds the finished model of an earlier run"):
        main(argv)
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before  # nothing touched
    assert [p.name for p in (out / "checkpoints").iterdir()] == ["checkpoint_4"]
    capsys.readouterr()
    results = run(out, resume="never", overwrite_output_dir=True, max_steps=2)
    assert results["train_flops"] > 0 and json.loads((out / "eval_results.json").read_text())["train_flops"] == \
        results["train_flops"]  # replaced by the new run's


def test_a_folder_of_other_files_is_refused_and_an_unfinished_run_is_resumed(tmp_path):
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "README.md").write_text("my notes")
    with pytest.raises(ValueError, match=rf"{notes} is not empty \(README.md\) and holds no run: this run would "
                                         r"write over what is there.*--overwrite_output_dir true"):
        run(notes)
    assert [p.name for p in notes.iterdir()] == ["README.md"] and (notes / "README.md").read_text() == "my notes"
    out, _ = interrupted_run(tmp_path)  # an unfinished run: no finished model, checkpoints to resume
    assert "eval_perplexity" in run(out)


def test_a_second_two_process_launch_on_the_output_dir_of_a_running_one_is_refused_and_the_first_loses_nothing(tmp_path):
    """Two launches of 2 CPU processes each on one output_dir. The first is held (SIGSTOP) once it
    has taken the lock, while the second runs: the second stops with one message, writes nothing;
    the first, let go, finishes as if alone."""
    import signal
    import subprocess

    from hf_outheads.training.safeguards import LOCK_FILE

    out = tmp_path / "shared"
    first_command, env = launch_command(tmp_path, ["--multi_gpu", "--num_processes", "2", "--main_process_port", "29547"],
                                        "first", output_dir=str(out), max_steps=4, save_steps=2, num_train_epochs=None)
    first = subprocess.Popen(first_command, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    held = []
    try:
        deadline = time.monotonic() + 240
        while not (out / LOCK_FILE).is_file() or not (out / LOCK_FILE).read_text().endswith("}"):
            assert first.poll() is None and time.monotonic() < deadline, first.communicate()[1][-3000:]
            time.sleep(0.2)
        held = [first.pid, *subprocess_runs.descendants(first.pid)]
        subprocess_runs.signal_all(held, signal.SIGSTOP)
        lock = (out / LOCK_FILE).read_text()
        written = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
        _, stderr = launch(tmp_path, ["--multi_gpu", "--num_processes", "2", "--main_process_port", "29549"], "second",
                           returncode=1, output_dir=str(out), max_steps=4, num_train_epochs=None)
        said = [line for line in stderr.splitlines() if line.startswith("train.py: error:")]
        assert len(said) == 1 and f"Another run is writing {out}: pid {json.loads(lock)['pid']}" in said[0], stderr[-3000:]
        assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == written and (out / LOCK_FILE).read_text() == lock
    finally:
        subprocess_runs.signal_all(held, signal.SIGCONT)
        stdout, stderr = first.communicate(timeout=300)
    assert first.returncode == 0, stderr[-3000:]
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["event"] for r in records if "event" in r] == ["start", "final"]
    assert records[0]["num_processes"] == 2 and (out / "model.safetensors").is_file()
    assert [p.name for p in (out / "checkpoints").iterdir()] == ["checkpoint_4"] and not (out / LOCK_FILE).exists()


# save_total_limit
@pytest.mark.parametrize("value", [-1, 0, 1.5, True, "all"])
def test_save_total_limit_is_a_positive_integer_or_null(value):
    """As transformers' TrainingArguments: None keeps every checkpoint, a positive integer that many;
    anything else is refused when parsed (-1 used to delete every checkpoint, the run's too)."""
    with pytest.raises(ValueError, match=rf"Option save_total_limit must be an integer >= 1, got {value!r}"):
        RunOptions.from_flat({**TINY, "save_total_limit": value})
    assert RunOptions.from_flat({**TINY, "save_total_limit": None}).training.save_total_limit is None


def test_the_checkpoint_just_saved_is_never_rotated_away(tmp_path):
    """A run resumed from an earlier checkpoint than the latest saves one that is not the newest
    by step; the rotation keeps it (and resume: auto then continues this run, not the other one)."""
    out, _ = interrupted_run(tmp_path, save_total_limit=None)
    run(out, stop_after_steps=4, save_total_limit=None)
    assert [p.name for p in checkpoints.complete_checkpoints(out)] == ["checkpoint_2", "checkpoint_4"]
    run(out, resume=str(out / "checkpoints" / "checkpoint_2"), stop_after_steps=3, save_steps=1, save_total_limit=1)
    assert [p.name for p in checkpoints.complete_checkpoints(out)] == ["checkpoint_3"]


# streamed data
def jsonl_data(folder: Path, task: str) -> dict:
    """Options of local JSON-lines files: causal text from the built-in corpus, or reversal pairs."""
    from hf_outheads.training.corpora.stdlib import build_records

    if task == "causal_lm":
        texts = [row["text"] for row in build_records("text")["train"][:160]]
        rows = {"train": [{"text": t} for t in texts[:140]], "validation": [{"text": t} for t in texts[140:]]}
    else:
        words = "alpha beta gamma delta epsilon zeta eta theta iota kappa".split()
        pairs = [{"source": " ".join(words[(i + j) % 10] for j in range(4)),
                  "target": " ".join(words[(i + j) % 10] for j in (3, 2, 1, 0))} for i in range(40)]
        rows = {"train": pairs[:30], "validation": pairs[30:]}
    for split, records in rows.items():
        (folder / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    data = {"dataset_name": None, "data_files": {split: str(folder / f"{split}.jsonl") for split in rows}}
    if task == "seq2seq":
        data.update(task="seq2seq", model_preset="t5-tiny", tokenizer="wordlevel", tokenizer_vocab_size=14,
                    tokenizer_min_frequency=1, max_source_length=8, max_target_length=8,
                    model_overrides={"d_model": 32, "d_ff": 64, "d_kv": 8, "num_layers": 1, "num_heads": 2},
                    generation_metrics=["sacrebleu"], num_generation_examples=4)
    return data


@pytest.mark.parametrize("source", ["causal_jsonl", "seq2seq_jsonl", "builtin"])
def test_streamed_data_trains_end_to_end_in_one_process(tmp_path, source):
    data = {} if source == "builtin" else jsonl_data(tmp_path, source.split("_")[0].replace("causal", "causal_lm"))
    out = tmp_path / "out"
    results = run(out, streaming=True, eval_steps=2, **data)
    assert results["eval_perplexity"] > 1 and (out / "model.safetensors").is_file()
    assert [p.name for p in checkpoints.complete_checkpoints(out)] == ["checkpoint_4"]
    assert [r["step"] for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if "train_loss" in r] \
        == [2, 4]


def test_streamed_data_trains_end_to_end_in_two_processes(tmp_path):
    start, stderr = launch(tmp_path, ["--multi_gpu", "--num_processes", "2", "--main_process_port", "29551"], "streamed",
                           streaming=True, max_steps=3, num_train_epochs=None, **jsonl_data(tmp_path, "causal_lm"))
    assert start["num_processes"] == 2 and start["max_steps"] == 3 and start["validation_examples"] is None
    assert (tmp_path / "streamed" / "model.safetensors").is_file() and "Traceback" not in stderr


# data with no text: one line, naming the file and line, nothing written
def test_a_data_file_without_text_is_named_and_nothing_is_written(tmp_path, capsys):
    from hf_outheads.training.train import main

    def refused(*flags):
        AcceleratorState._reset_state(True)
        GradientState._reset_state()
        argv = [f"--{k}={json.dumps(v) if isinstance(v, dict) else v}" for k, v in TINY.items()]
        with pytest.raises(SystemExit) as error:
            main([*argv, "--dataset_name=null", f"--output_dir={tmp_path / 'out'}", *flags])
        err = capsys.readouterr().err.strip()
        said = [line for line in err.splitlines() if "error" in line.lower() or "Traceback" in line]
        assert error.value.code == 2 and said == err.splitlines()[-1:], err  # besides datasets' progress bars
        assert not (tmp_path / "out").exists()  # not even the folder
        return said[0]

    (tmp_path / "empty.txt").write_text("\n\n  \n")
    (tmp_path / "some.txt").write_text("some text here\n")
    for kind in ("bpe", "wordlevel"):
        assert refused(f"--tokenizer={kind}", f"--data_files={{train: {tmp_path / 'empty.txt'}, validation: "
                       f"{tmp_path / 'some.txt'}}}") == (
            f"train.py: error: The 'train' split holds no text: field 'text' is empty or blank in each of its 3 "
            f"records ({tmp_path / 'empty.txt'}). Give data with text.")
    (tmp_path / "records.jsonl").write_text('{"text": "a b c"}\n\n{"body": "d e"}\n')
    (tmp_path / "some.jsonl").write_text('{"text": "some text here"}\n')
    said = refused(f"--data_files={{train: {tmp_path / 'records.jsonl'}, validation: {tmp_path / 'some.jsonl'}}}")
    assert said.startswith(f"train.py: error: {tmp_path / 'records.jsonl'}, line 3: field 'text' is missing or not text")
    # streamed: the same line, before a tokenizer is trained on the blank lines or a step runs on end-of-text alone
    from hf_outheads.training.tokenization import train_tokenizer

    train_tokenizer(["some text here"] * 3, "wordlevel", 20, 1).save_pretrained(tmp_path / "saved")
    for kind, split in (("bpe", "train"), ("wordlevel", "train"), (tmp_path / "saved", "train"),
                        (tmp_path / "saved", "validation")):
        files = {"train": tmp_path / "some.txt", "validation": tmp_path / "some.txt", split: tmp_path / "empty.txt"}
        assert refused("--streaming=true", f"--tokenizer={kind}", f"--data_files={{train: {files['train']}, "
                       f"validation: {files['validation']}}}") == (
            f"train.py: error: The {split!r} split holds no text: field 'text' is empty or blank in each of its 3 "
            f"records ({tmp_path / 'empty.txt'}). Give data with text.")
    (tmp_path / "short.txt").write_text("some text\n")  # text, but less than a block
    assert refused("--streaming=true", f"--tokenizer={tmp_path / 'saved'}", f"--data_files={{train: "
                   f"{tmp_path / 'short.txt'}, validation: {tmp_path / 'some.txt'}}}") == (
        f"train.py: error: The training split ({tmp_path / 'short.txt'}) has no example after tokenisation (fewer than "
        "block_size=32 tokens).")



def test_a_run_refused_after_its_tokenizer_was_saved_leaves_a_folder_the_next_run_trains_in(tmp_path):
    """A tokenizer trained here is saved before the data is tokenised: a run refused then (text shorter than
    one block) leaves it, and the same command given longer text trains in that folder rather than refusing it
    as a folder of someone else's files."""
    from hf_outheads.training.tracking import read_metrics

    (tmp_path / "short.txt").write_text("some text\n")
    (tmp_path / "long.txt").write_text("some text here and more words\n" * 100)
    settings = dict(dataset_name=None, tokenizer="wordlevel", tokenizer_vocab_size=20, max_steps=2, save_steps=2)
    with pytest.raises(ValueError, match="has no example after tokenisation"):
        run(tmp_path / "out", **settings, data_files={"train": str(tmp_path / "short.txt"),
                                                     "validation": str(tmp_path / "long.txt")})
    assert (tmp_path / "out" / "tokenizer.json").is_file()
    run(tmp_path / "out", **settings, data_files={"train": str(tmp_path / "long.txt"),
                                                 "validation": str(tmp_path / "long.txt")})
    assert (tmp_path / "out" / "config.json").is_file()
    assert [record["event"] for record in read_metrics(tmp_path / "out") if "event" in record][0] == "start"

# lengths against the backbone's positions
def test_a_block_longer_than_the_models_positions_is_refused_when_parsed(tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel

    from hf_outheads.training.train import parse_args

    base = ["--config", str(ROOT / "hf_outheads" / "training" / "configs" / "quickstart_lm.yaml"), "--output_dir", str(tmp_path / "out")]
    with pytest.raises(SystemExit, match=r"block_size=600 is larger than the gpt2 backbone's 512 positions: lower "
                                         r"block_size to at most 512, or give the preset more positions") as refused:
        parse_args([*base, "--block_size", "600"])
    assert refused.value.code == 2
    assert parse_args([*base, "--block_size", "600", "--model_overrides", "{n_positions: 600}"]).data.block_size == 600
    GPT2LMHeadModel(GPT2Config(n_embd=16, n_layer=1, n_head=2, vocab_size=300, n_positions=64)).save_pretrained(
        tmp_path / "small")
    with pytest.raises(SystemExit, match=r"block_size=128 is larger than the gpt2 backbone's 64 positions"):
        parse_args([*base, "--pretrained", str(tmp_path / "small"), "--block_size", "128"])
    assert not (tmp_path / "out").exists()


# a loss kernel that cannot run here
@pytest.mark.skipif(not __import__("hf_outheads.loss_kernels", fromlist=["x"]).unavailable(
    "liger", "cuda" if has_accelerator() else "cpu"), reason="Liger-Kernel can run here")
@pytest.mark.parametrize("head_flags", [["--head_options", "{training_loss: chunked, loss_kernel: liger}"],
                                        ["--head_type", "mtp", "--head_options", "{head_options: {loss_kernel: liger}}"]])
def test_a_loss_kernel_that_cannot_run_here_is_refused_when_parsed(tmp_path, head_flags):
    from hf_outheads.training.train import parse_args

    argv = ["--config", str(ROOT / "hf_outheads" / "training" / "configs" / "quickstart_lm.yaml"), "--output_dir", str(tmp_path / "out")]
    with pytest.raises(SystemExit, match=r"train.py: error: Option head_options: the loss kernel 'liger' cannot run "
                                         r"here: .*Use loss_kernel 'auto'") as refused:
        parse_args([*argv, *head_flags])
    assert refused.value.code == 2 and not (tmp_path / "out").exists()


# a resumed run is the run it says it is
@pytest.mark.parametrize("changed", [{"learning_rate": 5e-3}, {"per_device_train_batch_size": 2},
                                     {"gradient_accumulation_steps": 2}, {"block_size": 16}])
def test_resuming_with_an_option_that_changes_what_trains_is_refused_naming_it(tmp_path, changed):
    """A checkpoint keeps the options it was trained with; resuming it with one that changes what trains would
    train with both values while the record states one: refused, in one line naming the option, both values and
    what to do, before anything is trained or written. The same command with the checkpoint's values resumes."""
    from hf_outheads.training.train import parse_args

    out, checkpoint = interrupted_run(tmp_path)
    (name, value), = changed.items()
    saved = RunOptions.from_flat(TINY).flat()[name]
    expected = (rf"Resuming {re.escape(str(checkpoint))} with options other than it was trained with: {name} \(trained with "
                rf"{saved}, given {value}\).*Give the checkpoint's values to resume it, or train anew with another "
                r"--output_dir")
    with pytest.raises(ValueError, match=expected):
        run(out, **changed)
    argv = [f"--{k}={json.dumps(v) if isinstance(v, dict) else v}" for k, v in {**TINY, **changed}.items()]
    with pytest.raises(SystemExit, match=rf"^train.py: error: {expected}") as refused:
        parse_args([*argv, f"--output_dir={out}"])
    assert refused.value.code == 2
    assert not (out / "config.json").exists() and checkpoints.complete_checkpoints(out) == [checkpoint]
    # how the run reports may change, and an option the head does not use (tied re-assigns nothing)
    assert "eval_perplexity" in run(out, logging_steps=1, eval_steps=1, code_reassign_steps=3)


def test_resuming_a_periodically_updating_head_with_other_eval_steps_is_refused_when_they_set_its_interval(tmp_path):
    """eval_steps may change on resume, but a null code_reassign_steps is eval_steps for a head that updates
    itself periodically (lightrnn re-assigns its table): another eval_steps would change what trains, so it is
    refused, saying how to keep the interval; given explicitly, the same interval resumes."""
    out, checkpoint = interrupted_run(tmp_path, head_type="lightrnn", eval_steps=2)
    with pytest.raises(ValueError, match=r"code_reassign_steps \(trained with 2, given 1\) \(code_reassign_steps null is "
                                         r"eval_steps: to evaluate at other steps, give code_reassign_steps 2\)"):
        run(out, head_type="lightrnn", eval_steps=1)
    assert "eval_perplexity" in run(out, head_type="lightrnn", eval_steps=1, code_reassign_steps=2)

def test_a_resumed_run_may_be_given_another_length_and_its_record_says_so(tmp_path, capsys):
    """The run's length (max_steps) may change on resume: a line says so, metrics.jsonl logs the change at the
    step it was made, and the card's training procedure states it beside the final value."""
    out, checkpoint = interrupted_run(tmp_path)  # max_steps 4, stopped at 2
    capsys.readouterr()
    run(out, max_steps=6)
    assert (f"Resuming {checkpoint} with max_steps 6 (it was trained with 4): the run goes on to its new length; "
            "metrics.jsonl and the model card record the change.") in capsys.readouterr().out
    resumed = [r for r in json.loads(f"[{','.join((out / 'metrics.jsonl').read_text().splitlines())}]")
               if r.get("event") == "resume"]
    assert resumed == [{"step": 2, "event": "resume", "checkpoint": str(checkpoint), "changed": {"max_steps": [4, 6]}}]
    card = (out / "README.md").read_text()
    assert "| max_steps | 6 |" in card and "Resumed at step 2 with max_steps 6 (trained until then with 4)." in card
    assert "max_steps: 6" in (out / "train_config.yaml").read_text()


# the launch's mixed precision
def test_the_launchs_mixed_precision_applies_when_the_run_sets_none_and_a_line_says_which_won(tmp_path, monkeypatch,
                                                                                                capsys):
    """`accelerate launch --mixed_precision bf16` sets ACCELERATE_MIXED_PRECISION: a run that sets no
    mixed_precision trains so, and records it; a run that sets one trains with its own, and a line says so."""
    import yaml

    seen = []
    options = {**TINY, "max_steps": 2, "save_steps": None}
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "bf16")
    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    training_function(RunOptions.from_flat({**options, "output_dir": str(tmp_path / "launched")}),
                      [lambda progress, times: seen.append(AcceleratorState().mixed_precision)])
    assert seen == ["bf16", "bf16"]
    assert yaml.safe_load((tmp_path / "launched" / "train_config.yaml").read_text())["mixed_precision"] == "bf16"
    assert "| mixed_precision | bf16 |" in (tmp_path / "launched" / "README.md").read_text()
    capsys.readouterr()
    seen.clear()
    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    training_function(RunOptions.from_flat({**options, "output_dir": str(tmp_path / "own"), "mixed_precision": "no"}),
                      [lambda progress, times: seen.append(AcceleratorState().mixed_precision)])
    assert seen == ["no", "no"]
    assert ("mixed_precision: this run's option (no) is used, not the launch's (bf16, ACCELERATE_MIXED_PRECISION)."
            in capsys.readouterr().out)


# a run killed while it finishes
def test_a_run_killed_while_it_finishes_leaves_no_finished_looking_folder_and_reruns(tmp_path, monkeypatch):
    """The finished folder appears whole: config.json, which marks a finished model (`safeguards.earlier_work`)
    and without which none loads, is moved in last, after the weights, tokenizer, results, options and card. A
    run killed before it is not taken for a finished one: the same command again resumes it and finishes."""
    from hf_outheads.training import publish
    from hf_outheads.training.safeguards import earlier_work

    original = publish.render_card

    def killed(*args, **kwargs):
        raise KeyboardInterrupt  # as if the process died while the card was written

    out = tmp_path / "out"
    monkeypatch.setattr(publish, "render_card", killed)
    with pytest.raises(KeyboardInterrupt):
        run(out)
    monkeypatch.setattr(publish, "render_card", original)
    assert not (out / "config.json").exists() and earlier_work(out) is None
    assert not [p.name for p in out.iterdir() if p.name.startswith(".saving")]
    (out / ".saving-killed").mkdir()  # what a finish killed outright leaves
    assert "eval_perplexity" in run(out)
    assert {"config.json", "model.safetensors", "README.md", "eval_results.json", "train_config.yaml"} <= \
        {p.name for p in out.iterdir()} and not (out / ".saving-killed").exists()


def test_a_finish_killed_while_its_files_move_in_over_a_finished_model_leaves_no_finished_looking_mix(tmp_path,
                                                                                                     monkeypatch):
    """Finishing over an earlier finished model (told to overwrite): its config.json goes before the new files
    move in, so a run killed among the moves leaves no folder pairing it with the new files; the same command
    resumes and finishes."""
    from hf_outheads.training.safeguards import earlier_work

    out = tmp_path / "out"
    run(out)
    original = os.replace

    def killed(source, target):
        if Path(target) == out / "model.safetensors":
            raise KeyboardInterrupt  # as if the process died among the moves
        original(source, target)

    monkeypatch.setattr(os, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        run(out, overwrite_output_dir=True)
    monkeypatch.setattr(os, "replace", original)
    assert not (out / "config.json").exists() and earlier_work(out) is None
    assert "eval_perplexity" in run(out) and (out / "config.json").is_file()
