"""The commands as users type them (issue 41): the installed `hf-outheads train | export | quickstart`
and the scripts by path (`accelerate launch training/train.py`, `python training/train.py`) from any
folder, configs named as the READMEs write them, and an export of a folder that does not exist.

The installed command and the scripts by path run the installed package's `hf_outheads.training`;
their tests need this checkout installed (`pip install -e ".[dev]"`, as CI does). `.ci/run` also
runs them from a folder outside the repository after `pip install ".[train]"` in a fresh virtualenv."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest

import subprocess_runs
from training.launching import has_accelerator

ROOT = Path(__file__).resolve().parents[1]
INSTALLED = importlib.util.find_spec("hf_outheads.training")
needs_install = pytest.mark.skipif(
    INSTALLED is None or Path(INSTALLED.origin).parent != ROOT / "training",
    reason="hf_outheads is not installed from this checkout (pip install -e '.[dev]'): the installed command and "
           "the scripts by path run the installed package's training code")
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
TINY = ["--max_steps", "2", "--eval_steps", "2", "--save_steps", "2", "--max_train_samples", "60",
        "--max_eval_samples", "10", "--tokenizer_vocab_size", "300", "--block_size", "32",
        "--model_overrides", "{n_embd: 32, n_layer: 1, n_head: 2}", "--sample_max_new_tokens", "4"]


def command(*argv, cwd, timeout=300):
    return subprocess_runs.run([sys.executable, *map(str, argv)], env=ENV, cwd=cwd, timeout=timeout)


def test_the_command_lists_its_subcommands_and_refuses_an_unknown_one(capsys):
    from hf_outheads.cli import main

    main([])
    usage = capsys.readouterr().out
    assert all(f"\n  {name} " in usage for name in ("quickstart", "train", "export", "mtp-distill")), usage
    with pytest.raises(SystemExit, match="unknown command 'trian'; choose one of quickstart, train, export, mtp-distill"):
        main(["trian"])
    scripts = __import__("tomllib").loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {"hf-outheads": "hf_outheads.cli:main"}


def test_a_config_named_as_the_readmes_write_it_is_found_from_any_folder(tmp_path, monkeypatch):
    from training.options import SHIPPED_CONFIGS, config_path, parse_options

    monkeypatch.chdir(tmp_path)
    assert config_path("training/configs/quickstart_lm.yaml") == SHIPPED_CONFIGS / "quickstart_lm.yaml"
    assert parse_options(["--config", "training/configs/quickstart_seq2seq.yaml"]).task == "seq2seq"
    (tmp_path / "training" / "configs").mkdir(parents=True)
    (tmp_path / "training" / "configs" / "quickstart_lm.yaml").write_text("max_steps: 7\n")
    assert parse_options(["--config", "training/configs/quickstart_lm.yaml"]).max_steps == 7  # a file there wins
    with pytest.raises(ValueError, match=r"--config my/run.yaml: no such file. The shipped configs are "
                                         r"training/configs/\{.*quickstart_lm.yaml"):
        parse_options(["--config", "my/run.yaml"])


@needs_install
def test_the_installed_command_trains_and_exports_from_any_folder(tmp_path):
    entry = [e for e in importlib.metadata.entry_points(group="console_scripts") if e.name == "hf-outheads"]
    assert [e.value for e in entry] == ["hf_outheads.cli:main"]
    run = command("-m", "hf_outheads.cli", "train", "--config", "training/configs/quickstart_lm.yaml",
                  "--output_dir", "lm", *TINY, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "validation perplexity" in run.stdout and (tmp_path / "lm" / "model.safetensors").is_file()
    export = command("-m", "hf_outheads.cli", "export", "lm", "lm_plain", cwd=tmp_path)
    assert export.returncode == 0, export.stderr[-3000:]
    assert json.loads(export.stdout.strip().splitlines()[-1])["exact"] is True
    assert "Setting accelerator to CPU" not in run.stdout + run.stderr + export.stdout + export.stderr  # item 7


@needs_install
def test_the_scripts_run_by_path_from_the_repository_root_and_from_any_folder(tmp_path):
    launch = ["-m", "accelerate.commands.launch", "--num_processes", "1", "--num_machines", "1", "--mixed_precision",
              "no", "--dynamo_backend", "no"]
    for argv, cwd in (([*launch, "training/train.py"], ROOT), ([ROOT / "training" / "train.py"], tmp_path)):
        run = command(*argv, "--help", cwd=cwd, timeout=120)
        assert run.returncode == 0 and "--overwrite_output_dir" in run.stdout, run.stderr[-3000:]
    run = command(ROOT / "training" / "export.py", "missing", "out", cwd=tmp_path, timeout=120)
    assert run.returncode == 1 and run.stderr.strip() == "Not exported: the folder missing does not exist.", run.stderr
    run = command(ROOT / "training" / "mtp_distill.py", "--help", cwd=tmp_path, timeout=120)
    assert run.returncode == 0 and "--max_steps" in run.stdout, run.stderr[-3000:]
    run = command(ROOT / "training" / "mtp_distill.py", str(tmp_path), "--output_dir", "out", cwd=tmp_path, timeout=120)
    assert run.returncode == 1 and "has no train_config.yaml" in run.stderr, run.stderr[-3000:]


def test_exporting_a_folder_that_does_not_exist_says_so_in_one_line_without_the_hub(tmp_path, monkeypatch):
    """A missing folder, or a path that is no repo id (`namespace/name`) or is written as a local one,
    never reaches the Hub; a repo id does, and its failure is one line too."""
    import transformers

    from training.export import main

    def no_hub(name, *args, **kwargs):
        raise AssertionError(f"the Hub was asked for {name}")

    monkeypatch.chdir(tmp_path)
    (tmp_path / "outputs").mkdir()
    with monkeypatch.context() as patched:
        patched.setattr(transformers.AutoConfig, "from_pretrained", no_hub)
        for missing in ("missing_folder", "outputs/quickstart_lm", "./user/model", str(tmp_path / "gone"), "a/b/c"):
            with pytest.raises(SystemExit, match=f"^Not exported: the folder {missing} does not exist.$"):
                main([missing, "out"])
    with pytest.raises(SystemExit) as refused:  # offline (conftest): the Hub cannot be reached
        main(["someone/some-model", "out"])
    message = str(refused.value)
    assert message.startswith("Not exported: someone/some-model is no folder here, and loading it from the Hub failed")
    assert "\n" not in message and not (tmp_path / "out").exists()
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit, match="^Not exported: empty holds no model"):
        main(["empty", "out"])


@pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None,
                    reason="DeepSpeed is not installed (pip install 'hf_outheads[deepspeed]')")
def test_deepspeeds_cpu_notice_is_left_out_of_runs_that_do_not_use_deepspeed():
    """accelerate imports DeepSpeed wherever it is installed; on a machine without GPU it then logs
    "Setting accelerator to CPU ..." (on stdout). The training code drops that one message unless the
    launch asks for DeepSpeed."""
    code = ("import training, deepspeed.accelerator as a, deepspeed.utils as u; a.get_accelerator(); "
            "u.logger.warning('another DeepSpeed warning')")
    env = {k: v for k, v in ENV.items() if k not in ("DS_ACCELERATOR", "ACCELERATE_USE_DEEPSPEED")}
    for asked, env in ((False, env), (True, {**env, "ACCELERATE_USE_DEEPSPEED": "true"})):
        run = subprocess_runs.run([sys.executable, "-c", code], env=env, cwd=ROOT, timeout=120)
        assert run.returncode == 0, run.stderr[-3000:]
        assert ("Setting accelerator to CPU" in run.stdout) == (asked and not has_accelerator()), run.stdout  # GPU: none
        assert "another DeepSpeed warning" in run.stdout
