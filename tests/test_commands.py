"""The commands as users type them: the installed `hf-outheads train | export | quickstart`
and the scripts by path (`accelerate launch hf_outheads/training/train.py`, `python hf_outheads/training/train.py`) from any
folder, configs named as the READMEs write them, and an export of a folder that does not exist.

The installed command and the scripts by path run the installed package's `hf_outheads.training`;
their tests need this checkout installed (`pip install -e ".[dev]"`, as CI does). `.ci/run` also
runs them from a folder outside the repository after `pip install ".[train]"` in a fresh virtualenv."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import re
import os
import shutil
import sys
from pathlib import Path

import pytest

import subprocess_runs
from hf_outheads.training.launching import has_accelerator

ROOT = Path(__file__).resolve().parents[1]
INSTALLED = importlib.util.find_spec("hf_outheads.training")
needs_install = pytest.mark.skipif(
    INSTALLED is None or Path(INSTALLED.origin).parent != ROOT / "hf_outheads" / "training",
    reason="hf_outheads is not installed from this checkout (pip install -e '.[dev]'): the installed command and "
           "the scripts by path run the installed package's training code")
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
TINY = ["--max_steps", "2", "--eval_steps", "2", "--save_steps", "2", "--max_train_samples", "60",
        "--max_eval_samples", "10", "--tokenizer_vocab_size", "300", "--block_size", "32",
        "--model_overrides", "{n_embd: 32, n_layer: 1, n_head: 2}", "--sample_max_new_tokens", "4"]


def command(*argv, cwd, timeout=300):
    return subprocess_runs.run([sys.executable, *map(str, argv)], env=ENV, cwd=cwd, timeout=timeout)


def test_the_command_lists_its_subcommands_and_refuses_an_unknown_one(capsys):
    """`hf-outheads --help` prints the usage (status 0); no command, or an unknown one, is a usage error:
    status 2 and the usage or one line on stderr, as an argparse command with a required sub-command."""
    from hf_outheads.tools.cli import main

    main(["--help"])
    usage = capsys.readouterr().out
    assert all(f"\n  {name} " in usage for name in ("quickstart", "train", "mtp-distill", "export", "gguf", "serve")), usage
    with pytest.raises(SystemExit) as error:
        main([])
    said = capsys.readouterr()
    assert error.value.code == 2 and said.out == "" and said.err.startswith(usage.strip())
    assert said.err.strip().endswith("hf-outheads: error: a command is required.")
    with pytest.raises(SystemExit) as error:
        main(["trian"])
    assert error.value.code == 2 and capsys.readouterr().err.strip() == (
        "hf-outheads: error: unknown command 'trian'; choose one of quickstart, train, mtp-distill, export, gguf, serve.")
    scripts = __import__("tomllib").loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {"hf-outheads": "hf_outheads.tools.cli:main"}


def test_a_config_named_as_the_readmes_write_it_is_found_from_any_folder(tmp_path, monkeypatch):
    from hf_outheads.training.options import SHIPPED_CONFIGS, config_path, parse_options

    monkeypatch.chdir(tmp_path)
    assert config_path("hf_outheads/training/configs/quickstart_lm.yaml") == SHIPPED_CONFIGS / "quickstart_lm.yaml"
    assert parse_options(["--config", "hf_outheads/training/configs/quickstart_seq2seq.yaml"]).model.task == "seq2seq"
    (tmp_path / "hf_outheads" / "training" / "configs").mkdir(parents=True)
    (tmp_path / "hf_outheads" / "training" / "configs" / "quickstart_lm.yaml").write_text("max_steps: 7\n")
    assert parse_options(["--config", "hf_outheads/training/configs/quickstart_lm.yaml"]).training.max_steps == 7  # a file there wins
    with pytest.raises(ValueError, match=r"--config my/run.yaml: no such file. The shipped configs are "
                                         r"hf_outheads/training/configs/\{.*quickstart_lm.yaml"):
        parse_options(["--config", "my/run.yaml"])


@needs_install
def test_the_installed_command_trains_and_exports_from_any_folder(tmp_path):
    entry = [e for e in importlib.metadata.entry_points(group="console_scripts") if e.name == "hf-outheads"]
    assert [e.value for e in entry] == ["hf_outheads.tools.cli:main"]
    run = command("-m", "hf_outheads.tools.cli", "train", "--config", "hf_outheads/training/configs/quickstart_lm.yaml",
                  "--output_dir", "lm", *TINY, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "validation perplexity" in run.stdout and (tmp_path / "lm" / "model.safetensors").is_file()
    export = command("-m", "hf_outheads.tools.cli", "export", "lm", "lm_plain", cwd=tmp_path)
    assert export.returncode == 0, export.stderr[-3000:]
    assert json.loads(export.stdout.strip().splitlines()[-1])["exact"] is True
    assert "Setting accelerator to CPU" not in run.stdout + run.stderr + export.stdout + export.stderr  # item 7


@needs_install
def test_the_scripts_run_by_path_from_the_repository_root_and_from_any_folder(tmp_path):
    launch = ["-m", "accelerate.commands.launch", "--num_processes", "1", "--num_machines", "1", "--mixed_precision",
              "no", "--dynamo_backend", "no"]
    for argv, cwd in (([*launch, "hf_outheads/training/train.py"], ROOT), ([ROOT / "hf_outheads" / "training" / "train.py"], tmp_path)):
        run = command(*argv, "--help", cwd=cwd, timeout=120)
        assert run.returncode == 0 and "--overwrite_output_dir" in run.stdout, run.stderr[-3000:]
    run = command(ROOT / "hf_outheads" / "tools" / "export.py", "missing", "out", cwd=tmp_path, timeout=120)
    assert run.returncode == 2 and run.stderr.strip() == "Not exported: the folder missing does not exist.", run.stderr
    run = command(ROOT / "hf_outheads" / "training" / "mtp_distill.py", "--help", cwd=tmp_path, timeout=120)
    assert run.returncode == 0 and "--max_steps" in run.stdout, run.stderr[-3000:]
    run = command(ROOT / "hf_outheads" / "training" / "mtp_distill.py", str(tmp_path), "--output_dir", "out", cwd=tmp_path, timeout=120)
    assert run.returncode == 2 and "has no train_config.yaml" in run.stderr, run.stderr[-3000:]


def test_exporting_a_folder_that_does_not_exist_says_so_in_one_line_without_the_hub(tmp_path, monkeypatch):
    """A missing folder, or a path that is no repo id (`namespace/name`) or is written as a local one,
    never reaches the Hub; a repo id does, and its failure is one line too."""
    import transformers

    from hf_outheads.tools.export import main

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
    code = ("import hf_outheads.training, deepspeed.accelerator as a, deepspeed.utils as u; a.get_accelerator(); "
            "u.logger.warning('another DeepSpeed warning')")
    env = {k: v for k, v in ENV.items() if k not in ("DS_ACCELERATOR", "ACCELERATE_USE_DEEPSPEED")}
    for asked, env in ((False, env), (True, {**env, "ACCELERATE_USE_DEEPSPEED": "true"})):
        run = subprocess_runs.run([sys.executable, "-c", code], env=env, cwd=ROOT, timeout=120)
        assert run.returncode == 0, run.stderr[-3000:]
        assert ("Setting accelerator to CPU" in run.stdout) == (asked and not has_accelerator()), run.stdout  # GPU: none
        assert "another DeepSpeed warning" in run.stdout


# (command line, what its one line says); `{tmp}`: the test's folder, holding `tab.yaml` and `broken.yaml`
BAD_COMMAND_LINES = [
    (["train", "--bad"], r"hf-outheads train: error: Unknown option\(s\) \['--bad'\] in the command line"),
    (["train", "--max-steps", "abc"], r"max_steps must be an integer >= 1, got 'abc'"),
    (["train", "--config", "{tmp}/broken.yaml"], r"--config .*broken.yaml is not valid YAML: .* at line 2, column 1"),
    (["train", "--config", "{tmp}/tab.yaml"], r"--config .*tab.yaml is not valid YAML: .*\(YAML indents with spaces, not tabs\)"),
    (["train", "--head_options", "{depth: 2"], r"--head_options \{depth: 2 is not valid YAML"),
    (["train", "--save_total_limit", "-1"], r"save_total_limit must be an integer >= 1, got -1"),
    (["train", "--lr_scheduler_type", "cosin"], r"lr_scheduler_type='cosin' is not one of \['linear', 'cosine'"),
    (["train", "--config", "hf_outheads/training/configs/quickstart_lm.yaml", "--pretrained", "no-one/no-model"],
     r"Option pretrained='no-one/no-model': its config cannot be loaded"),
    (["train", "--config", "hf_outheads/training/configs/quickstart_lm.yaml", "--dataset_name", "null", "--data_files",
      "{train: gone.txt, validation: gone.txt}"], r"The data_files .*gone.txt.* cannot be loaded: "),
    (["train", "--config", "hf_outheads/training/configs/quickstart_lm.yaml", "--tokenizer", "no-such-folder/"],
     r"The tokenizer 'no-such-folder/' cannot be loaded: "),
    (["train", "--config", "hf_outheads/training/configs/quickstart_lm.yaml", "--generation_metrics", "[sacrebleu]"],
     r"Option generation_metrics \(BLEU, chrF, ROUGE\) applies to task: seq2seq"),
    (["train", "--config", "hf_outheads/training/configs/quickstart_seq2seq.yaml", "--generation_metrics", "[bleu]"],
     r"Option generation_metrics: unknown metric\(s\) \['bleu'\]. Valid metrics: \['chrf', 'rouge', 'sacrebleu'\]"),
    (["train", "--config", "hf_outheads/training/configs/quickstart_lm.yaml", "--model_overrides", "{n_embd: abc}"],
     r"Option model_overrides=\{'n_embd': 'abc'\}: .*expected int"),
    (["train", "--config", "hf_outheads/training/configs/quickstart_lm.yaml", "--model_overrides", "{n_embd: 30, n_head: 4}"],
     r"The gpt2-tiny model cannot be built with these options: .*divisible by num_heads"),
    (["train", "--config", "hf_outheads/training/configs/quickstart_lm.yaml", "--head_type", "doc", "--head_options",
      "{components: [[5, 2]]}"], r"The gpt2-tiny model cannot be built with these options: Head 'doc': layer 5 does not"),
    (["export", "--bad"], r"hf-outheads export: error: "),
    (["export", "run", "out", "--approximate"], r"--approximate measures what it drops costs on --text-file FILE: give it"),
    (["mtp-distill", "--bad"], r"hf-outheads mtp-distill: error: "),
    (["mtp-distill", "run", "--output_dir", "out", "--prompts", "0"], r"Option prompts must be an integer >= 1, got 0"),
    (["quickstart", "--bad"], r"Unknown option\(s\) \['--bad'\] in the command line"),
    (["quickstart", "--overwrite_output_dir", "maybe"], r"Option overwrite_output_dir must be true or false, got 'maybe'"),
    (["quickstart", "--block-size", "600"], r"block_size=600 is larger than the gpt2 backbone's 512 positions"),
]


@needs_install
@pytest.mark.parametrize("argv,said", BAD_COMMAND_LINES, ids=[" ".join(a) for a, _ in BAD_COMMAND_LINES])
def test_every_command_refuses_a_bad_command_line_in_one_line_with_status_2(argv, said, tmp_path, monkeypatch, capsys):
    """One line on stderr, exit status 2 (argparse's), no traceback, and
    nothing written; YAML that does not parse (a file, a tab-indented one, a flag's value) is named."""
    from hf_outheads.tools.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", sys.argv[:1])
    (tmp_path / "broken.yaml").write_text("max_steps: 2\n- oops\n")
    (tmp_path / "tab.yaml").write_text("head_options:\n\tdepth: 2\n")
    before = sorted(tmp_path.iterdir())
    with pytest.raises(SystemExit) as error:
        main([a.replace("{tmp}", str(tmp_path)) for a in argv])
    err = capsys.readouterr().err.strip()
    assert error.value.code == 2, err
    assert len(err.splitlines()) == 1 and re.search(said, err), err
    assert err.startswith(f"hf-outheads {argv[0]}: error: "), err  # named by the command typed
    assert sorted(tmp_path.iterdir()) == before


@needs_install
def test_dashed_spellings_are_accepted_and_every_commands_help_shows_the_defaults(tmp_path, monkeypatch, capsys):
    """`--max-steps` is `--max_steps` (as `HfArgumentParser` reads both, and
    `hf-outheads export` has `--text-file`), and `--help` gives each option's default."""
    from hf_outheads.tools.cli import main
    from hf_outheads.training.options import parse_options
    from hf_outheads.training.quickstart import parse_args as quickstart_args

    options = parse_options(["--max-steps", "3", "--output-dir", "x", "--head-options", "{depth: 2}", "--head-type",
                             "drill", "--overwrite-output-dir"])
    assert (options.training.max_steps, options.training.output_dir, options.model.head_options, options.training.overwrite_output_dir) == \
        (3, "x", {"depth": 2}, True)
    assert quickstart_args(["--output-root", "r", "--overwrite-output-dir", "true"]).output_root == "r"
    monkeypatch.setattr(sys, "argv", sys.argv[:1])
    defaults = {"train": ["--max_steps", "(default: None)", "--save_total_limit", "(default: 2)"],
                "export": ["--overwrite", "(default: False)"],
                "mtp-distill": ["--prompts", "(default: 512)", "--learning_rate", "(default: 0.001)"],
                "quickstart": ["--output_root", "(default: outputs)", "--task", "(default: both)"]}
    for name, (*pairs,) in defaults.items():
        with pytest.raises(SystemExit) as done:
            main([name, "--help"])
        text = " ".join(capsys.readouterr().out.split())
        assert done.value.code == 0
        for flag, default in zip(pairs[::2], pairs[1::2]):
            assert re.search(rf"{re.escape(flag)} \S+ .*?{re.escape(default)}", text) or \
                re.search(rf"{re.escape(flag)} .*?{re.escape(default)}", text), (name, flag, text[:3000])


HELP_EXAMPLES = {  # a command's examples, each printed as a line of its own by `--help`
    "train": "  hf-outheads train --config hf_outheads/training/configs/quickstart_lm.yaml [--key value ...]",
    "export": "    hf-outheads export <trained_dir> <out_dir> --approximate --text-file sample.txt",
    "quickstart": "    hf-outheads quickstart --task lm  # only one of them",
    "mtp-distill": "    hf-outheads mtp-distill RUN_DIR --output_dir OUT [--prompts 512 --max_steps 300] [--overwrite]",
    "serve": "    hf-outheads serve outputs/quickstart_lm --port 8000",
    "gguf": "    hf-outheads gguf LLAMA_CPP_DIR PLAIN_DIR [convert_hf_to_gguf.py options]",
}


@needs_install
def test_every_commands_help_answers_before_torch_is_imported_and_shows_its_examples_as_lines():
    """`hf-outheads --help` and `hf-outheads <command> --help` parse before torch and
    transformers are imported (the package's names are imported on first use), and print the
    command's example command lines as they are written."""
    from hf_outheads.tools.cli import COMMANDS

    for argv in (["--help"], *([name, "--help"] for name in COMMANDS)):
        code = (f"import sys\nfrom hf_outheads.tools.cli import main\ntry:\n    main({argv!r})\nexcept SystemExit as done:\n"
                "    assert not done.code, done.code\nprint([m for m in ('torch', 'transformers') if m in sys.modules])")
        run = subprocess_runs.run([sys.executable, "-c", code], env=ENV, cwd=ROOT, timeout=120)
        assert run.returncode == 0 and run.stdout.strip().splitlines()[-1] == "[]", (argv, run.stdout[-300:], run.stderr[-2000:])
        if argv[0] in HELP_EXAMPLES:
            assert HELP_EXAMPLES[argv[0]] in run.stdout.splitlines(), (argv, run.stdout[:1500])


def test_the_scheduler_choices_are_transformers_ones():
    """`lr_scheduler_type`'s choices are written out (importing `SchedulerType` imports torch): they agree."""
    from transformers import SchedulerType

    from hf_outheads.training.options import SCHEDULER_TYPES

    assert SCHEDULER_TYPES == tuple(kind.value for kind in SchedulerType)


@pytest.fixture(scope="module")
def mtp_run(tmp_path_factory):
    """A tiny `mtp` run that train.py wrote (in process), and a folder of a `tied` model with a
    train_config.yaml: (mtp run, tied folder)."""
    from accelerate.state import AcceleratorState, GradientState

    from tiny import tiny_model
    from hf_outheads.training.options import RunOptions
    from hf_outheads.training.run import training_function

    root = tmp_path_factory.mktemp("distill")
    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    options = dict(task="causal_lm", model_preset="gpt2-tiny", model_overrides={"n_embd": 32, "n_layer": 1, "n_head": 2},
                   dataset_name="stdlib_docstrings", dataset_config="text", max_train_samples=60, max_eval_samples=10,
                   tokenizer="bpe", tokenizer_vocab_size=300, block_size=32, per_device_train_batch_size=4,
                   max_steps=2, report_to="none", sample_max_new_tokens=4, head_type="mtp", output_dir=str(root / "mtp"))
    training_function(RunOptions.from_flat(options))
    tied = root / "tied"
    tiny_model("gpt2", "tied").save_pretrained(tied)
    shutil.copy(root / "mtp" / "train_config.yaml", tied)
    return root / "mtp", tied


DISTILL = ["--prompts", "4", "--prompt_tokens", "8", "--new_tokens", "4", "--batch_size", "2", "--max_steps", "2"]


def test_mtp_distill_runs_on_a_run_that_train_wrote_and_replaces_only_a_folder_it_is_told_to(mtp_run, tmp_path, capsys):
    """train.py saves its options (train_config.yaml), which mtp-distill reads;
    a non-empty output_dir (another run) is refused as export refuses it, and replaced whole with
    --overwrite; the run itself, a folder inside it or around it never."""
    from transformers import AutoModelForCausalLM

    from hf_outheads.training.mtp_distill import main
    from hf_outheads.training.options import parse_options

    run, _ = mtp_run
    assert parse_options(["--config", str(run / "train_config.yaml")]).model.head_type == "mtp"
    main([str(run), "--output_dir", str(tmp_path / "distilled"), *DISTILL])
    assert json.loads((tmp_path / "distilled" / "distill.json").read_text())["losses_after"]
    assert AutoModelForCausalLM.from_pretrained(tmp_path / "distilled").config.head_type == "mtp"
    other = tmp_path / "other_run"
    shutil.copytree(run, other)
    before = {p.name: p.read_bytes() for p in other.iterdir() if p.is_file()}
    capsys.readouterr()
    for target, flags, said in ((other, [], r"other_run is not empty \(\d+ entries: .*pass --overwrite to replace the "),
                                (run, ["--overwrite"], r"The output folder .* is .*, which this command reads"),
                                (run / "distilled", ["--overwrite"], r"The output folder .*distilled lies inside")):
        with pytest.raises(SystemExit, match=rf"^mtp_distill.py: error: .*{said}") as refused:
            main([str(run), "--output_dir", str(target), *flags, *DISTILL])
        assert refused.value.code == 2 and len(capsys.readouterr().err.strip().splitlines()) == 1
    assert {p.name: p.read_bytes() for p in other.iterdir() if p.is_file()} == before
    main([str(run), "--output_dir", str(other), "--overwrite", *DISTILL])
    assert sorted(p.name for p in other.iterdir() if not p.name.endswith(".py")) == sorted(
        p.name for p in (tmp_path / "distilled").iterdir() if not p.name.endswith(".py"))  # no README, metrics, ...


def test_mtp_distill_refuses_a_model_that_is_not_mtp_before_generating(mtp_run, tmp_path, monkeypatch, capsys):
    from hf_outheads.training import mtp_distill

    _, tied = mtp_run
    monkeypatch.setattr(mtp_distill, "greedy_examples", lambda *a, **k: pytest.fail("generated before refusing"))
    with pytest.raises(SystemExit, match=r"^mtp_distill.py: error: self-distillation trains an `mtp` head's "
                                         r"future-token predictors; this model's head is 'tied'") as refused:
        mtp_distill.main([str(tied), "--output_dir", str(tmp_path / "out"), *DISTILL])
    assert refused.value.code == 2 and len(capsys.readouterr().err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()
