"""A run never loses earlier work nor leaves a stale folder: an export never mixes two models, a
damaged tokenizer file is named, one run per output_dir, a NaN stops the run and keeps the last
good checkpoint, the final sample fits the context, a vocabulary smaller than the tokenizer is
refused, a full disk is named and leaves the earlier save loadable, push_to_hub without the Hub
fails before training, and the cards' usage snippets run as written. Tiny in-process runs (about a
second each)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from accelerate.state import AcceleratorState, GradientState

import subprocess_runs
from hf_outheads.training.options import RunOptions, parse_options
from hf_outheads.training.run import training_function

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART_LM = ROOT / "hf_outheads" / "training" / "configs" / "quickstart_lm.yaml"
TINY = dict(task="causal_lm", model_preset="gpt2-tiny", model_overrides={"n_embd": 32, "n_layer": 1, "n_head": 2},
            dataset_name="stdlib_docstrings", dataset_config="text", max_train_samples=60, max_eval_samples=10,
            tokenizer="bpe", tokenizer_vocab_size=300, block_size=32, per_device_train_batch_size=4,
            per_device_eval_batch_size=8, learning_rate=1e-3, dropout=0.0, logging_steps=2, report_to="none",
            max_steps=4, save_steps=2, save_total_limit=1, sample_max_new_tokens=8)
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
       "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}


def run(output_dir, **overrides):
    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    return training_function(RunOptions.from_flat({**TINY, "output_dir": str(output_dir), **overrides}))


def quickstart_head_options() -> dict:
    return yaml.safe_load(QUICKSTART_LM.read_text()).get("head_options_by_head", {})


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A finished tiny run that exports exactly (no output bias): (output_dir, results)."""
    out = tmp_path_factory.mktemp("trained") / "run"
    results = run(out, head_options={"output_bias": False}, license="apache-2.0")
    return out, results


def export_cli(*argv):
    from hf_outheads.tools.export import main

    return main([str(a) for a in argv])


# an export into a non-empty folder
def test_export_into_a_non_empty_folder_is_refused_and_overwrite_replaces_the_whole_folder(trained, tmp_path):
    out, _ = trained
    target = tmp_path / "plain"
    shutil.copytree(out, target, ignore=shutil.ignore_patterns("checkpoints"))  # an export over a run folder
    before = sorted(p.name for p in target.iterdir())
    with pytest.raises(SystemExit, match="not empty.*--overwrite"):
        export_cli(out, target)
    assert sorted(p.name for p in target.iterdir()) == before  # untouched
    (target / "model.safetensors.index.json").write_text("{}")  # as a sharded save leaves
    report = export_cli(out, target, "--overwrite")
    assert report["exact"] and report["architecture"] == "GPT2LMHeadModel"
    names = {p.name for p in target.iterdir()}
    assert "model.safetensors.index.json" not in names and "modeling_outheads.py" not in names
    assert json.loads((target / "config.json").read_text())["model_type"] == "gpt2"
    assert not [p for p in tmp_path.iterdir() if p.name != "plain"]  # no staging folder left beside it


# a damaged tokenizer file
def test_a_damaged_tokenizer_file_is_named_by_the_export_and_on_resume(trained, tmp_path):
    out, _ = trained
    broken = tmp_path / "broken"
    shutil.copytree(out, broken)
    text = (broken / "tokenizer.json").read_text()
    (broken / "tokenizer.json").write_text(text[: len(text) // 2])  # truncated
    with pytest.raises(SystemExit, match=re.escape(str(broken / "tokenizer.json"))):
        export_cli(broken, tmp_path / "plain")
    assert not (tmp_path / "plain").exists()
    (broken / "tokenizer.json").write_bytes(b"")  # empty
    with pytest.raises(SystemExit, match=r"tokenizer.json exists but cannot be read.*`hf-outheads train` with --resume "):
        export_cli(broken, tmp_path / "plain")  # the command that makes a new tokenizer, not an option of export
    (broken / "tokenizer.json").write_bytes(b"\xff\xfe\x00garbage")  # not UTF-8
    with pytest.raises(ValueError, match=re.escape(str(broken / "tokenizer.json"))):
        run(broken, max_steps=6, overwrite_output_dir=True)  # resumes from checkpoint_4: loads the saved tokenizer


def test_a_folder_without_a_tokenizer_is_exported_without_one(trained, tmp_path):
    out, _ = trained
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("config.json", "model.safetensors", "generation_config.json"):
        shutil.copy(out / name, bare / name)
    export_cli(bare, tmp_path / "plain")
    assert not (tmp_path / "plain" / "tokenizer.json").exists()


# two runs on one output_dir
def test_a_second_run_on_a_locked_output_dir_is_refused_naming_the_first(tmp_path):
    from hf_outheads.training.safeguards import LOCK_FILE, OutputDirInUse, _process_start

    out = tmp_path / "out"
    out.mkdir()
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        import socket

        lock = {"pid": other.pid, "host": socket.gethostname(), "process_start": _process_start(other.pid),
                "started": "then"}
        (out / LOCK_FILE).write_text(json.dumps(lock))
        with pytest.raises(OutputDirInUse, match=f"pid {other.pid}.*another --output_dir"):
            run(out)
        assert not (out / "checkpoints").exists() and not (out / "tokenizer.json").exists()  # nothing touched
    finally:
        other.kill()
        other.wait()
    # the first run has ended (killed): its lock is stale and taken over
    results = run(out, max_steps=2)
    assert "eval_perplexity" in results


def test_a_lock_being_written_is_a_run_starting_and_an_old_empty_one_a_killed_run(tmp_path):
    """The lock file is created, then written: read in between, it is empty. That is a run starting
    now (refused), unless it has stayed empty for longer than any write takes (a run killed then)."""
    from hf_outheads.training.safeguards import LOCK_FILE, STARTING_S, OutputDirInUse, RunLock

    (tmp_path / LOCK_FILE).write_text("")
    with pytest.raises(OutputDirInUse, match="a run starting now, writing its lock"):
        RunLock(tmp_path).acquire()
    old = time.time() - STARTING_S - 1
    os.utime(tmp_path / LOCK_FILE, (old, old))
    lock = RunLock(tmp_path)
    assert lock.acquire() is None and json.loads((tmp_path / LOCK_FILE).read_text())["pid"] == os.getpid()
    lock.release()


def test_the_command_line_refuses_a_locked_output_dir_and_releases_its_own_lock(tmp_path, capsys):
    from hf_outheads.training.safeguards import LOCK_FILE
    from hf_outheads.training.train import main

    out = tmp_path / "out"
    out.mkdir()
    (out / LOCK_FILE).write_text(json.dumps({"pid": 1, "host": "some-other-machine", "started": "then"}))
    argv = [f"--{k}={json.dumps(v) if isinstance(v, dict) else v}" for k, v in TINY.items()] + [f"--output_dir={out}"]
    AcceleratorState._reset_state(True)
    with pytest.raises(SystemExit, match="Another run is writing .*pid 1 on some-other-machine"):
        main(argv)
    (out / LOCK_FILE).unlink()
    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    main(argv + ["--max_steps=2"])
    assert not (out / LOCK_FILE).exists() and (out / "model.safetensors").is_file()


# a NaN loss
def test_a_non_finite_loss_stops_at_its_step_and_keeps_the_last_good_checkpoint(tmp_path):
    from hf_outheads.training.safeguards import NonFiniteError

    out = tmp_path / "out"
    with pytest.raises(NonFiniteError, match=r"optimizer step (\d+): the (training loss|gradient norm) is (nan|inf)") as error:
        run(out, learning_rate=1e30, warmup_steps=0, max_steps=8, save_steps=1, save_total_limit=None)
    step = int(re.search(r"optimizer step (\d+)", str(error.value)).group(1))
    assert 1 < step <= 3  # the first step is finite; the huge update makes the next ones NaN
    kept = out / "checkpoints" / f"checkpoint_{step - 1}"
    assert f"The last good checkpoint, {kept}, is kept" in str(error.value)
    assert sorted(p.name for p in (out / "checkpoints").iterdir())[-1] == kept.name  # nothing saved after it
    assert not (out / "model.safetensors").exists()


# the final sample at a short context
def test_a_run_whose_context_is_shorter_than_prompt_and_sample_is_saved(tmp_path):
    out = tmp_path / "out"
    overrides = {**TINY["model_overrides"], "n_positions": 40}
    results = run(out, model_overrides=overrides, sample_max_new_tokens=40)
    assert (out / "model.safetensors").is_file() and (out / "README.md").is_file()
    assert 0 < results["sample_max_new_tokens"] < 40
    assert f"max_new_tokens={results['sample_max_new_tokens']}" in (out / "README.md").read_text()


# a vocabulary smaller than the tokenizer
def test_a_model_vocabulary_smaller_than_the_tokenizer_is_refused_before_training(tmp_path):
    from hf_outheads.training.preflight import check_run

    overrides = {**TINY["model_overrides"], "vocab_size": 100}
    with pytest.raises(ValueError, match="vocab_size = 100 is smaller than the tokenizer"):
        check_run(RunOptions.from_flat({**TINY, "output_dir": str(tmp_path / "a"), "model_overrides": overrides}))
    with pytest.raises(ValueError, match="vocab_size = 100 is smaller than the tokenizer's 300 tokens"):
        run(tmp_path / "b", model_overrides=overrides, tokenizer_vocab_size=300)
    assert not (tmp_path / "b" / "checkpoints").exists()


# a full disk: a real one (a small tmpfs in a private mount namespace) where it can be made
FULL_DISK = r"""
import json, os, subprocess, sys, torch
from pathlib import Path
from accelerate import Accelerator
from tiny import tiny_model
from transformers import AutoModelForCausalLM
from hf_outheads.training import checkpoints

disk, what, report = Path(sys.argv[1]), sys.argv[2], {}
torch.manual_seed(0)
model = tiny_model("gpt2", "tied")
def mount(size):
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(disk)], check=True)
def size_of(folder):
    return sum(p.stat().st_size for p in Path(folder).rglob("*") if p.is_file())
if what == "checkpoint":
    accelerator = Accelerator(cpu=True)
    optimizer = torch.optim.AdamW(model.parameters())
    model.zero_grad(); model(torch.tensor([[1, 5, 7]]), labels=torch.tensor([[1, 5, 7]])).loss.backward(); optimizer.step()
    model, optimizer = accelerator.prepare(model, optimizer)
    probe = checkpoints.save_checkpoint(accelerator, model, "/tmp/probe-" + str(os.getpid()), {"step": 1}, None)
    one = size_of(probe)
    mount(int(one * 1.5) // 4096 * 4096)  # room for one checkpoint, not two
    first = checkpoints.save_checkpoint(accelerator, model, disk, {"step": 1}, 1)
    try:
        checkpoints.save_checkpoint(accelerator, model, disk, {"step": 2}, 1)
    except OSError as error:
        report["error"] = f"{type(error).__name__}: {error}"
    report["left"] = sorted(p.name for p in (disk / "checkpoints").iterdir())
    report["resume"] = str(checkpoints.checkpoint_to_resume(disk, "auto"))
else:
    folder, ids = disk / "model", torch.tensor([[1, 5, 7]])
    mount(4 * 1024 * 1024)
    model.to(torch.bfloat16).save_pretrained(folder)  # the earlier save
    expected = AutoModelForCausalLM.from_pretrained(folder)(ids).logits
    free = os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize
    (disk / "filler").write_bytes(b"0" * (free - 32 * 1024))  # the disk fills up (checkpoints, logs, ...)
    try:
        model.to(torch.float32).save_pretrained(folder)  # twice the weights' bytes: no room
    except Exception as error:
        report["error"] = f"{type(error).__name__}: {str(error)[:200]}"
    try:
        report["same"] = bool(torch.equal(AutoModelForCausalLM.from_pretrained(folder)(ids).logits, expected))
    except Exception as error:
        report["same"] = f"does not load: {type(error).__name__}: {str(error)[:200]}"
    report["files"] = sorted(p.name for p in folder.iterdir() if not p.name.endswith(".py"))
print("REPORT" + json.dumps(report))
"""


def full_disk(tmp_path, what: str) -> dict:
    if not shutil.which("unshare") or not hasattr(os, "geteuid") or os.geteuid() != 0:
        pytest.skip("needs root and unshare to mount a small tmpfs in a private mount namespace")
    disk = tmp_path / "disk"
    disk.mkdir()
    script = tmp_path / "full_disk.py"
    script.write_text(FULL_DISK)
    env = {**ENV, "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), ENV["PYTHONPATH"]])}  # `tiny`, `training`
    done = subprocess_runs.run(["unshare", "--mount", "--propagation", "private", sys.executable, str(script), str(disk),
                                what], env=env, timeout=240)
    if "mount" in done.stderr and "REPORT" not in done.stdout:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr[-300:]}")
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.split("REPORT")[-1])


def test_a_full_disk_during_a_checkpoint_is_named_and_keeps_the_last_checkpoint(tmp_path):
    report = full_disk(tmp_path, "checkpoint")
    assert report["error"].startswith("OSError: [Errno 28] The disk is full: writing ")
    assert "tmp-checkpoint_2" in report["error"] and "bytes are free on the filesystem of" in report["error"]
    assert report["left"] == ["checkpoint_1"]  # the partial save removed, the complete one kept
    assert report["resume"].endswith("checkpoints/checkpoint_1")


def test_a_full_disk_during_save_pretrained_over_an_earlier_save_leaves_the_earlier_one(tmp_path):
    report = full_disk(tmp_path, "save_pretrained")
    assert "error" in report and ("No space" in report["error"] or "28" in report["error"]
                                  or "iostream" in report["error"] or "write" in report["error"].lower())
    assert report["same"] is True, report["same"]  # the folder still loads, with the earlier save's weights
    assert [name for name in report["files"] if name.startswith(".saving-")] == []


# the built-in corpus without dataset_config
def test_stdlib_docstrings_without_dataset_config_writes_the_card(tmp_path):
    out = tmp_path / "out"
    run(out, dataset_config=None, max_steps=2)
    card = (out / "README.md").read_text()
    assert "language modelling on the docstrings of the Python standard library" in card
    assert "config: text" in card


# the quickstart's model exports exactly, as the README's serving command
def test_the_quickstart_heads_export_exactly_with_the_serving_command(tmp_path):
    options = parse_options(["--config", str(QUICKSTART_LM)])
    assert options.model.head.options.output_bias is False
    for head in ("tied", "linear", "bilinear", "drill", "joint"):
        assert parse_options(["--config", str(QUICKSTART_LM), "--head_type", head]).model.head.options.output_bias is False
    out = tmp_path / "quickstart_lm"  # a tiny run with the quickstart's head options, trained: the bias would move
    run(out, head_options_by_head=quickstart_head_options())
    report = export_cli(out, tmp_path / "quickstart_lm_plain")
    assert report["exact"] and report["mean_kl"] is None
    readme = (ROOT / "README.md").read_text()
    assert "hf-outheads export outputs/quickstart_lm outputs/quickstart_lm_plain" in readme


# push_to_hub offline
def test_push_to_hub_without_the_hub_fails_before_training(tmp_path, monkeypatch):
    import huggingface_hub
    from huggingface_hub import constants

    from hf_outheads.training.train import parse_args

    argv = ["--config", str(QUICKSTART_LM), "--output_dir", str(tmp_path / "out"), "--push_to_hub", "true"]
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(SystemExit, match="HF_HUB_OFFLINE is set.*drop --push_to_hub.*hf upload"):
        parse_args(argv)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub, "get_token", lambda: None)
    with pytest.raises(SystemExit, match="needs a Hub token"):
        parse_args(argv)
    monkeypatch.setattr(huggingface_hub, "get_token", lambda: "hf_x")

    def unreachable(self, *args, **kwargs):
        raise ConnectionError("no network")

    monkeypatch.setattr(huggingface_hub.HfApi, "whoami", unreachable)
    with pytest.raises(SystemExit, match="cannot be reached with this token .*no network"):
        parse_args(argv)
    assert not (tmp_path / "out").exists()


# every card's usage snippet runs
def snippets(card_text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", card_text, flags=re.S)


def run_snippet(code: str, cwd) -> str:
    done = subprocess_runs.run([sys.executable, "-c", code], env=ENV, cwd=cwd, timeout=240)
    assert done.returncode == 0, f"{code}\n{done.stderr[-3000:]}"
    return done.stdout


def test_every_cards_usage_snippet_runs(trained, tmp_path):
    from transformers import AutoModelForCausalLM

    import hf_outheads.configuration_outheads  # noqa: F401  (registers the Auto classes)

    out, results = trained
    # the training card: generates the card's sample again
    [code] = snippets((out / "README.md").read_text())
    assert run_snippet(code, tmp_path).strip() == results["sample"].strip()
    # the model's own card (push_to_hub's README)
    model = AutoModelForCausalLM.from_pretrained(out)
    [code] = snippets(model.create_model_card(str(out)).content)
    assert run_snippet(code, tmp_path).strip()
    # the plain export's card, which keeps the trained model's license
    export_cli(out, tmp_path / "plain")
    card = (tmp_path / "plain" / "README.md").read_text()
    assert "<namespace>" not in card and "license: apache-2.0" in card
    [code] = snippets(card)
    assert run_snippet(code, tmp_path).strip()


# an export onto its source, around it or inside it
def test_an_export_onto_what_it_reads_is_refused_and_a_replaced_folder_is_the_only_one_touched(trained, tmp_path):
    from transformers import AutoModelForCausalLM

    from hf_outheads.tools.folders import TargetIsSource

    out, _ = trained
    parent, link = tmp_path / "parent", tmp_path / "link"
    run = parent / "run"
    shutil.copytree(out, run)
    (parent / "sibling").mkdir()
    (parent / "sibling" / "notes.txt").write_text("mine")
    link.symlink_to(run, target_is_directory=True)

    def files():
        return {str(p.relative_to(tmp_path)): p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}

    before = files()
    for target, how in ((run, "is"), (link, "is"), (parent, "contains"), (run / "plain", "lies inside")):
        with pytest.raises(SystemExit, match=rf"^Not exported: The output folder {re.escape(str(target))} {how} "
                                             rf"{re.escape(str(run))}, which this command reads") as refused:
            export_cli(run, target, "--overwrite")
        assert refused.value.code == 2
        assert files() == before and sorted(p.name for p in tmp_path.iterdir()) == ["link", "parent"]
    model = AutoModelForCausalLM.from_pretrained(link)  # the library's export: the folder it was loaded from
    with pytest.raises(TargetIsSource, match="is .*which this command reads"):
        model.export_plain(run, overwrite=True)
    target = parent / "plain"  # a folder apart: replaced whole, nothing beside it touched
    target.mkdir()
    (target / "old.txt").write_text("old")
    export_cli(run, target, "--overwrite")
    assert not (target / "old.txt").exists() and (target / "config.json").is_file()
    assert sorted(p.name for p in parent.iterdir()) == ["plain", "run", "sibling"]
    assert {k: v for k, v in files().items() if not k.startswith("parent/plain/")} == before


@pytest.mark.parametrize("exchange", [True, False], ids=["one rename", "renamed aside first"])
def test_a_folder_is_swapped_in_whole_or_not_at_all(tmp_path, monkeypatch, exchange):
    from hf_outheads.tools import folders
    from hf_outheads.tools.folders import staged_folder

    if not exchange:  # where renameat2 is missing (not Linux) or the filesystem refuses it
        monkeypatch.setattr(folders, "_exchange", lambda a, b: False)
    target = tmp_path / "target"
    target.mkdir()
    (target / "old.txt").write_text("old")
    with pytest.raises(RuntimeError, match="failed half-way"):
        with staged_folder(target, overwrite=True) as written:
            (written / "new.txt").write_text("new")
            raise RuntimeError("failed half-way")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["target"] and [p.name for p in target.iterdir()] == ["old.txt"]
    with pytest.raises(FileExistsError, match=r"target is not empty \(1 entries: old.txt\).*pass overwrite=True"):
        with staged_folder(target):
            raise AssertionError("never entered")
    with staged_folder(target, overwrite=True) as written:
        (written / "new.txt").write_text("new")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["target"] and [p.name for p in target.iterdir()] == ["new.txt"]


@pytest.mark.parametrize("system", ["posix", "windows"])
@pytest.mark.parametrize("exchange", [True, False], ids=["one rename", "renamed aside first"])
@pytest.mark.parametrize("start", ["absent", "empty"])
def test_a_folder_filled_by_another_writer_meanwhile_is_refused_at_the_swap(tmp_path, monkeypatch, system, exchange,
                                                                            start):
    """Two writers into one new (or empty) folder, neither told to overwrite: the one that swaps in
    second is refused, naming what is there, and leaves the first one's folder as it is and nothing beside it.
    `windows`: a system whose rename never replaces an existing folder (the empty one is removed first)."""
    from hf_outheads.tools import folders
    from hf_outheads.tools.folders import staged_folder

    if not exchange:
        monkeypatch.setattr(folders, "_exchange", lambda a, b: False)
    if system == "windows":
        rename = os.rename

        def rename_onto_nothing(source, destination):
            if os.path.exists(destination):
                raise FileExistsError(17, "Cannot create a file when that file already exists", str(destination))
            rename(source, destination)

        monkeypatch.setattr(folders.os, "rename", rename_onto_nothing)
    target = tmp_path / "target"
    if start == "empty":
        target.mkdir()
    with pytest.raises(FileExistsError, match=r"target is not empty \(1 entries: first.txt\).*pass --overwrite"):
        with staged_folder(target, overwrite_hint="pass --overwrite") as written:
            (written / "second.txt").write_text("second")
            with staged_folder(target) as first:  # the other writer, done meanwhile
                (first / "first.txt").write_text("first")
    assert [p.name for p in tmp_path.iterdir()] == ["target"] and [p.name for p in target.iterdir()] == ["first.txt"]
    with staged_folder(tmp_path / "new") as written:  # and alone, it is written as before
        (written / "new.txt").write_text("new")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["new", "target"]


def test_two_exports_into_one_new_folder_at_once_leave_the_first_and_refuse_the_second(trained, tmp_path, monkeypatch):
    from hf_outheads.tools import export_plain

    out, _ = trained
    target = tmp_path / "plain"
    card = export_plain.build_plain_model_card

    def meanwhile_another_export(*args, **kwargs):  # the other export finishes while this one writes its card
        monkeypatch.setattr(export_plain, "build_plain_model_card", card)
        export_cli(out, target)
        (target / "first.txt").write_text("the first export's")
        return card(*args, **kwargs)

    monkeypatch.setattr(export_plain, "build_plain_model_card", meanwhile_another_export)
    with pytest.raises(SystemExit, match=rf"^Not exported: {re.escape(str(target))} is not empty \(.*first.txt.*"
                                         "--overwrite") as refused:
        export_cli(out, target)
    assert refused.value.code == 2
    assert (target / "first.txt").is_file() and (target / "config.json").is_file()
    assert [p.name for p in tmp_path.iterdir()] == ["plain"]  # no staging folder left


# a run or the quickstart writing into what it reads (the rule of every command)
def test_a_run_and_the_quickstart_never_write_into_what_they_read(tmp_path, capsys):
    from hf_outheads.training.quickstart import main as quickstart
    from hf_outheads.training.train import parse_args

    out = tmp_path / "out"
    out.mkdir()
    (out / "train.txt").write_text("some text\n" * 50)
    data = f"{{train: {out / 'train.txt'}, validation: {out / 'train.txt'}}}"
    base = ["--config", str(QUICKSTART_LM), "--dataset_name", "null", "--data_files", data]
    with pytest.raises(SystemExit, match=rf"output_dir {re.escape(str(out))} contains {re.escape(str(out / 'train.txt'))}, "
                                         "which this command reads") as refused:
        parse_args([*base, "--output_dir", str(out), "--overwrite_output_dir", "true"])
    assert refused.value.code == 2
    with pytest.raises(SystemExit, match=rf"output_dir {re.escape(str(out / 'sub'))} lies inside {re.escape(str(out))}"):
        parse_args(["--config", str(QUICKSTART_LM), "--pretrained", str(out), "--output_dir", str(out / "sub")])
    root = tmp_path / "root"
    (root / "quickstart_lm").mkdir(parents=True)
    (root / "quickstart_lm" / "train.txt").write_text("some text\n" * 50)
    data = f"{{train: {root / 'quickstart_lm' / 'train.txt'}, validation: {root / 'quickstart_lm' / 'train.txt'}}}"
    with pytest.raises(SystemExit, match=r"output_dir .*quickstart_lm contains .*train.txt, which this command reads"):
        quickstart(["--task", "lm", "--output_root", str(root), "--overwrite_output_dir", "true", "--dataset_name", "null",
                    "--data_files", data])
    assert [p.name for p in out.iterdir()] == ["train.txt"] and [p.name for p in (root / "quickstart_lm").iterdir()] == \
        ["train.txt"]
    assert "=== by hand" not in capsys.readouterr().out  # nothing launched


# a lock file this script did not write
@pytest.mark.parametrize("content", ["[1, 2]", '{"pid": "abc", "host": "here"}', '{"pid": 5}', '"text"'])
def test_a_corrupt_lock_file_is_named_with_what_to_do_and_nothing_is_written(tmp_path, content, capsys):
    from hf_outheads.training.safeguards import LOCK_FILE
    from hf_outheads.training.train import main

    out = tmp_path / "out"
    out.mkdir()
    (out / LOCK_FILE).write_text(content)
    argv = [f"--{k}={json.dumps(v) if isinstance(v, dict) else v}" for k, v in TINY.items()] + [f"--output_dir={out}"]
    AcceleratorState._reset_state(True)
    with pytest.raises(SystemExit) as refused:
        main(argv)
    err = capsys.readouterr().err.strip()
    assert refused.value.code == 2 and len(err.splitlines()) == 1, err
    assert err.startswith(f"train.py: error: The lock file {out / LOCK_FILE} holds ") and err.endswith(
        f"If none is, delete {out / LOCK_FILE}."), err
    assert [p.name for p in out.iterdir()] == [LOCK_FILE] and (out / LOCK_FILE).read_text() == content


# a push that fails after training
@pytest.mark.parametrize("failing", ["create_repo", "create_commit"])
def test_a_push_that_fails_after_training_keeps_the_card_and_says_how_to_upload_later(tmp_path, monkeypatch, capsys,
                                                                                        failing):
    """A Hub that answers before training and fails after it (503 on creating the repository or on the
    upload): the folder is complete, its card written before any push; the command ends with one line saying
    so and giving the command that uploads it later, exit status 1."""
    import httpx2
    import huggingface_hub
    from huggingface_hub import HfApi, constants
    from huggingface_hub.errors import HfHubHTTPError
    from huggingface_hub.hf_api import RepoUrl

    from hf_outheads.training.train import main

    def unavailable(self, *args, **kwargs):
        url = "https://huggingface.co/api/repos/create"
        raise HfHubHTTPError(f"503 Server Error: Service Unavailable for url: {url}\nRetry later.",
                             response=httpx2.Response(503, request=httpx2.Request("POST", url)))

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub, "get_token", lambda: "hf_x")
    monkeypatch.setattr(HfApi, "whoami", lambda self, *args, **kwargs: {"name": "someone"})
    monkeypatch.setattr(HfApi, "create_repo", lambda self, repo_id, **kwargs: RepoUrl(f"https://huggingface.co/{repo_id}"))
    monkeypatch.setattr(HfApi, failing, unavailable)
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out"
    argv = [f"--{k}={json.dumps(v) if isinstance(v, dict) else v}" for k, v in TINY.items()]
    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    with pytest.raises(SystemExit) as failed:  # output_dir given relative: the upload command names the folder whole
        main([*argv, "--output_dir=out", "--push_to_hub=true", "--hub_model_id=someone/tiny"])
    message = failed.value.code
    assert isinstance(message, str) and "\n" not in message and "Traceback" not in capsys.readouterr().err
    assert message.startswith("train.py: error: The push to the Hub failed (HfHubHTTPError: 503 Server Error")
    assert (f"{out} is complete (model, tokenizer, card); upload it later with `hf upload someone/tiny {out} "
            "--exclude 'checkpoints/*'`") in message
    assert {"config.json", "model.safetensors", "tokenizer.json", "README.md", "eval_results.json"} <= \
        {p.name for p in out.iterdir()}
    assert 'from_pretrained("someone/tiny")' in (out / "README.md").read_text()


def test_a_worker_of_a_multi_process_run_exits_saying_a_failed_push_with_status_1():
    """A launched run whose push failed ends as a finished one does (no distributed teardown, which can hang)
    but says the failure on stderr and exits with status 1; a finished one exits silently with 0."""
    code = ("import sys; from hf_outheads.training.run import exit_without_teardown; "
            "exit_without_teardown(*sys.argv[1:]); print('not reached')")
    failed = subprocess.run([sys.executable, "-c", code, "train.py: error: The push to the Hub failed (x)"],
                            capture_output=True, text=True, timeout=120)
    assert (failed.returncode, failed.stdout, failed.stderr) == (1, "", "train.py: error: The push to the Hub failed (x)\n")
    finished = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert (finished.returncode, finished.stdout, finished.stderr) == (0, "", "")
