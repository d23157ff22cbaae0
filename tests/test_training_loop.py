"""train.py's one loop: batches checked on the host where they are built, naming the
example; no read from the device between logging steps; step times that count the waits for the
device; each run's rates in its final event; pre-tokenised data used as it is; only the named modules
trained, every dropout off, a schedule's own arguments and the data's own seed. Tiny in-process runs
(about a second each)."""

from __future__ import annotations

import json
import traceback
from pathlib import Path

import pytest
import torch
from accelerate.state import AcceleratorState, GradientState
from torch.overrides import TorchFunctionMode

from hf_outheads.training import loop, modeling, train
from hf_outheads.training import run as training_run
from hf_outheads.training.options import RunOptions
from hf_outheads.training.tokenization import train_tokenizer
from hf_outheads.training.tracking import read_metrics

TINY = dict(task="causal_lm", model_preset="gpt2-tiny", model_overrides={"n_embd": 32, "n_layer": 1, "n_head": 2},
            dataset_name="stdlib_docstrings", dataset_config="text", max_train_samples=60, max_eval_samples=10,
            tokenizer="bpe", tokenizer_vocab_size=300, block_size=32, per_device_train_batch_size=4,
            per_device_eval_batch_size=8, learning_rate=1e-3, dropout=0.0, logging_steps=3, report_to="none",
            max_steps=6, sample_max_new_tokens=4, dataloader_num_workers=0)
BLOCK, ROWS = 16, 24


def argv(values: dict) -> list[str]:
    """Command-line flags of `values` (their YAML spelling)."""
    return [f"--{key}={json.dumps(value) if isinstance(value, (dict, list)) or value is None else value}"
            for key, value in values.items()]


def run(output_dir, callbacks=(), **overrides):
    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    return training_run.training_function(RunOptions.from_flat({**TINY, "output_dir": str(output_dir), **overrides}), callbacks)


@pytest.fixture(scope="module")
def tokenised(tmp_path_factory):
    """A tokenizer folder (300 tokens) and (train, validation) rows of BLOCK ids in range, as lists."""
    folder = tmp_path_factory.mktemp("tokenizer")
    texts = [f"line {i}: the head reads the blocks of ids as they are, {i * 7} times" for i in range(200)]
    tokenizer = train_tokenizer(texts, "bpe", 300)
    tokenizer.save_pretrained(folder)
    ids = tokenizer(" ".join(texts))["input_ids"]
    rows = [ids[i * BLOCK:(i + 1) * BLOCK] for i in range(ROWS + 8)]
    return folder, rows[:ROWS], rows[ROWS:]


def pretokenised_files(folder: Path, train_rows, validation_rows, **columns) -> dict:
    """Parquet files of `input_ids` rows (and any further columns of the training split)."""
    from datasets import Dataset

    files = {}
    for split, rows in (("train", train_rows), ("validation", validation_rows)):
        files[split] = str(folder / f"{split}.parquet")
        Dataset.from_dict({"input_ids": rows, **(columns if split == "train" else {})}).to_parquet(files[split])
    return files


def pretokenised_run(tokenised, tmp_path, **overrides):
    tokenizer, train_rows, validation_rows = tokenised
    files = pretokenised_files(tmp_path, train_rows, validation_rows)
    return dict(dataset_name=None, dataset_config=None, max_train_samples=None, tokenizer=str(tokenizer),
                data_files=files, block_size=BLOCK, **overrides)


def test_pre_tokenised_rows_train_as_they_are(tokenised, tmp_path):
    """A split with an `input_ids` column is used as it is: one example a row, scored on its ids, its word counts
    from them; the final sample's prompt is its first row decoded."""
    out = tmp_path / "out"
    results = run(out, **pretokenised_run(tokenised, tmp_path, max_steps=ROWS // 4, logging_steps=1))
    start = read_metrics(out)[0]
    assert start["max_steps"] == ROWS // 4  # one epoch: a row is an example, not text grouped into blocks
    assert results["train_tokens"] == ROWS * BLOCK and results["eval_tokens"] == 8 * (BLOCK - 1)
    assert results["sample_prompt"] and results["sample"].startswith(results["sample_prompt"][:10])


def test_pre_tokenised_data_needs_the_tokenizer_it_was_made_with(tokenised, tmp_path, capsys):
    flags = argv({**TINY, **pretokenised_run(tokenised, tmp_path), "tokenizer": "bpe"})
    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    with pytest.raises(SystemExit) as error:
        train.main([*flags, f"--output_dir={tmp_path / 'out'}"])
    assert error.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "train.py: error: The training data is already tokenised (an input_ids column), so a bpe tokenizer cannot be "
        "trained on it: set tokenizer to the folder or Hub id of the tokenizer its ids were made with.")


@pytest.mark.parametrize("workers", [0, 1])
@pytest.mark.parametrize("column,value,said", [
    ("input_ids", 300, "holds the token id 300 in input_ids (position 5); the model takes a token id from 0 to 299"),
    ("labels", -7, "holds the label -7 in labels (position 5); the model takes -100 (not scored) or a token id from 0 "
                   "to 299"),
    ("input_ids", None, f"has {BLOCK + 1} input_ids, more than block_size={BLOCK}: cut the example to {BLOCK}"),
])
def test_a_bad_example_in_a_training_batch_is_one_line_naming_it(tokenised, tmp_path, capsys, column, value, said,
                                                                 workers):
    """Ids and labels are checked on the host where the batch is built (the collator, in a worker process
    with `dataloader_num_workers`), not in the model's forward: a bad one is one line naming the example (its index in
    the training set), the value and its place, never a device-side assert; exit status 1 (found while training)."""
    tokenizer, train_rows, validation_rows = tokenised
    rows = [list(row) for row in train_rows]
    labels = [list(row) for row in train_rows]
    bad = {"input_ids": rows, "labels": labels}[column]
    bad[17][5] = value
    if value is None:
        bad[17].append(7)
        labels[17].append(7)
    files = pretokenised_files(tmp_path, rows, validation_rows, labels=labels)
    flags = {**TINY, "dataset_name": None, "dataset_config": None, "max_train_samples": None,
             "tokenizer": str(tokenizer), "data_files": files, "block_size": BLOCK, "dataloader_num_workers": workers,
             "per_device_train_batch_size": ROWS, "output_dir": str(tmp_path / "out")}
    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    with pytest.raises(SystemExit) as error:
        train.main(argv(flags))
    said_by_python = error.value.code  # (a message as the exit code: Python prints it and exits with status 1)
    assert said_by_python.startswith(f"train.py: error: Example 17 of the training set {said}"), said_by_python
    assert "\n" not in said_by_python and "Traceback" not in capsys.readouterr().err


class HostReads(TorchFunctionMode):
    """Every read of a tensor's values on the host (a wait for the device on a GPU), with the optimizer step it
    happened in and whether it was inside the step's forward, backward and update (`loop.window_step`) or in the
    loop's bookkeeping after it. torch's AdamW reads its step counters (`_get_value`), which it keeps on the host
    (on a GPU too, unless fused or capturable): not a read of the device."""

    READS = {torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.__bool__, torch.Tensor.__int__,
             torch.Tensor.__float__, torch.Tensor.__index__, torch.Tensor.numpy, torch.Tensor.nonzero, torch.nonzero,
             torch.Tensor.unique, torch.unique, torch.Tensor.masked_select, torch.masked_select, torch.argwhere}

    def __init__(self):
        super().__init__()
        self.reads, self.step, self.in_step = [], 0, False

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in self.READS:
            stack = traceback.extract_stack()[:-1]
            if not any(frame.name == "_get_value" and frame.filename.endswith("optimizer.py") for frame in stack):
                caller = next(frame for frame in reversed(stack) if "/torch/" not in frame.filename)
                self.reads.append((self.step, self.in_step, f"{func.__name__} at {Path(caller.filename).name}:"
                                                            f"{caller.lineno}"))
        return func(*args, **(kwargs or {}))


def test_the_eager_training_step_reads_nothing_from_the_device_between_logging_steps(tmp_path, monkeypatch):
    """Between logging steps, an eager step (forward, backward, clipping, update, schedule) and the loop's
    bookkeeping read no value back from the device; the reads of a logging step (the loss, the non-finite watch) are
    the only ones. The batches, collated in this process here, are checked without a tensor read, and packed blocks
    come without an attention mask, which transformers would check for padding at every forward."""
    host = HostReads()
    window_step, train_loop = loop.window_step, training_run.train_loop

    def counted_step(*args, **kwargs):
        host.step, host.in_step = host.step + 1, True
        try:
            return window_step(*args, **kwargs)
        finally:
            host.in_step = False

    def counted_loop(*args, **kwargs):
        with host:
            return train_loop(*args, **kwargs)

    monkeypatch.setattr(loop, "window_step", counted_step)
    monkeypatch.setattr(training_run, "train_loop", counted_loop)
    run(tmp_path / "out", max_grad_norm=1.0, gradient_accumulation_steps=2)
    assert host.step == TINY["max_steps"]
    assert [read for read in host.reads if read[1]] == []  # inside a step: nothing
    # between steps: at the logging steps only, and where the epoch starts (before step 1) the sampler draws its order
    # from a generator on the host (accelerate's data_loader.py)
    assert {step for step, _, _ in host.reads} == {0, 3, 6}
    assert all("data_loader.py" in where for step, _, where in host.reads if step == 0)


def test_every_step_trains_in_training_mode_whatever_mode_the_model_came_in(tmp_path, monkeypatch):
    """A converted pretrained model comes in eval mode (as from_pretrained gives it), where its loss is the
    next-token NLL alone and dropout is off: every training step runs in training mode all the same."""
    build, window_step, modes = training_run.build_model, loop.window_step, []

    def recorded_step(accelerator, model, *args, **kwargs):
        modes.append(model.training)
        return window_step(accelerator, model, *args, **kwargs)

    monkeypatch.setattr(training_run, "build_model", lambda *args: build(*args).eval())
    monkeypatch.setattr(loop, "window_step", recorded_step)
    run(tmp_path / "out")
    assert modes == [True] * TINY["max_steps"]


def test_a_steps_time_counts_the_wait_for_the_device_at_a_logging_step(tmp_path, monkeypatch):
    """The host runs ahead of the device and waits for it where it reads (the non-finite watch, the loss of a
    logging step): that wait belongs to the step that reads, so that the steps' times add up to the device's. A
    clock that only the reads advance (by 100 s) shows it."""
    clock = {"now": 0.0}
    monkeypatch.setattr(loop.time, "perf_counter", lambda: clock["now"])
    check = loop.NonFiniteWatch.check

    def waiting_check(self):
        clock["now"] += 100.0
        return check(self)

    monkeypatch.setattr(loop.NonFiniteWatch, "check", waiting_check)
    results = run(tmp_path / "out")
    assert results["train_seconds"] == 200.0  # the logging steps 3 and 6
    assert [r["train_seconds"] for r in read_metrics(tmp_path / "out") if r.get("event") == "final"] == [200.0]


def test_a_run_logs_its_rates_against_its_device(tmp_path):
    """tokens/s, achieved TFLOP/s and (on a GPU) MFU against the measured bf16 peak, of the steps after the first, in
    the final event and the results; a CPU has no measured peak."""
    results = run(tmp_path / "out")
    final = [r for r in read_metrics(tmp_path / "out") if r.get("event") == "final"][0]
    for key in ("tokens_per_s", "achieved_tflops", "mfu", "peak_tflops", "train_step_time_s", "warm_up_steps",
                "loss_path", "device", "train_tokens"):
        assert final[key] == results[key], key
    tokens = TINY["per_device_train_batch_size"] * TINY["block_size"]
    assert results["tokens_per_s"] == pytest.approx(tokens / results["train_step_time_s"])
    assert results["achieved_tflops"] == pytest.approx(results["train_flops_per_step"] / results["train_step_time_s"] / 1e12)
    assert (results["device"], results["peak_tflops"], results["mfu"], results["warm_up_steps"]) == ("cpu", None, None, 1)
    assert results["train_tokens"] == TINY["max_steps"] * tokens and results["loss_path"] == "full"


def test_trainable_modules_train_alone_and_a_name_that_is_no_module_is_refused(tmp_path, capsys):
    from hf_outheads import OutHeadsConfig, OutHeadsForCausalLM
    from tiny import tiny_config

    model = OutHeadsForCausalLM(OutHeadsConfig(text_config=tiny_config("gpt2"), head_type="drill"))
    modeling.train_only(model, ["head.layers"])
    trained = {name for name, p in model.named_parameters() if p.requires_grad}
    assert trained and trained == {name for name, _ in model.named_parameters() if name.startswith("head.layers.")}
    with pytest.raises(ValueError, match=r"Option trainable_modules: 'head.predictors' is no module of the model; its "
                                         r"modules are named like backbone, .*head"):
        modeling.train_only(model, ["head.predictors"])
    with pytest.raises(ValueError, match="'head.dropout' is a module without parameters"):
        modeling.train_only(model, ["head.dropout"])
    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    with pytest.raises(SystemExit) as error:
        train.main([*argv(TINY), "--trainable_modules=[head.predictors]", f"--output_dir={tmp_path / 'out'}"])
    assert error.value.code == 2 and "trainable_modules: 'head.predictors' is no module" in capsys.readouterr().err


def test_disable_dropout_switches_every_dropout_off_and_keeps_the_config():
    from hf_outheads import OutHeadsConfig, OutHeadsForCausalLM
    from tiny import tiny_config

    model = OutHeadsForCausalLM(OutHeadsConfig(text_config=tiny_config("gpt2"), head_type="drill",
                                               head_options={"dropout": 0.3}))
    rates = {module.p for module in model.modules() if isinstance(module, torch.nn.Dropout)}
    assert 0.3 in rates and len(rates) > 1  # the head's and the backbone's
    config = model.config.to_dict()
    modeling.without_dropout(model)
    assert {module.p for module in model.modules() if isinstance(module, torch.nn.Dropout)} == {0.0}
    assert model.config.to_dict() == config


def test_the_schedule_takes_its_own_arguments_checked_when_parsed(tmp_path):
    from hf_outheads.training.preflight import check_run

    options = dict(TINY, output_dir=str(tmp_path / "out"), lr_scheduler_type="cosine_with_min_lr")
    with pytest.raises(ValueError, match=r"Option lr_scheduler_kwargs=\{\} does not fit lr_scheduler_type="
                                         r"cosine_with_min_lr: One of min_lr or min_lr_rate"):
        check_run(RunOptions.from_flat(options))
    run(tmp_path / "out", lr_scheduler_type="cosine_with_min_lr", lr_scheduler_kwargs={"min_lr_rate": 0.5},
        logging_steps=1)
    rates = [r["learning_rate"] for r in read_metrics(tmp_path / "out") if "learning_rate" in r]
    assert rates[-1] == pytest.approx(TINY["learning_rate"] * 0.5)  # decayed to half the peak, not to 0


def test_the_data_seed_orders_the_batches_whatever_the_seed(tmp_path):
    """Runs of other seeds see the same batches with one `data_seed` (the scale comparison's second seeds)."""
    def first_batches(seed, data_seed):
        seen = []
        window_step = loop.window_step

        def recording(accelerator, model, optimizer, scheduler, window, *args):
            seen.append(window[0]["input_ids"].tolist())
            return window_step(accelerator, model, optimizer, scheduler, window, *args)

        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(loop, "window_step", recording)
            run(tmp_path / f"{seed}-{data_seed}", seed=seed, data_seed=data_seed, max_steps=3)
        return seen

    assert first_batches(1, 5) == first_batches(2, 5) != first_batches(2, None)


@pytest.mark.parametrize("device,given,workers", [("cpu", None, 0), ("cuda", None, None), ("cuda", 2, 2),
                                                  ("cpu", 3, 3)])
def test_batches_are_collated_by_workers_on_a_gpu_by_default(device, given, workers):
    import os

    options = RunOptions.from_flat({"dataloader_num_workers": given})
    cores = len(os.sched_getaffinity(0))
    assert training_run.dataloader_workers(options, torch.device(device)) == (min(4, cores) if workers is None else workers)
