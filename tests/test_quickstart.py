"""`hf-outheads quickstart` (hf_outheads/training/quickstart.py): refusals, replacing an earlier run, and the
figures it checks against the stated ones."""

import os
import subprocess
import sys
from pathlib import Path

def test_training_quickstart_with_a_wrong_option_fails_in_one_message(tmp_path):
    """`python -m hf_outheads.training.quickstart` passes extra options to train.py, which checks them before
    any task is launched: a wrong one is train.py's one line, exit status 2, no traceback, nothing
    trained."""
    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    run = subprocess.run([sys.executable, "-m", "hf_outheads.training.quickstart", "--output_root", str(tmp_path),
                          "--head_type", "softmaxx"], cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr[-3000:]
    assert run.stderr.strip().splitlines() == [line for line in run.stderr.strip().splitlines()
                                               if line.startswith("train.py: error: Unknown head type 'softmaxx'")]
    assert "=== by hand" not in run.stdout and list(tmp_path.iterdir()) == []


def test_the_quickstart_keeps_an_earlier_run_unless_told_to_replace_it(tmp_path):
    """Before anything is trained: an earlier quickstart's model in output_root stops it, naming what to
    do; with --overwrite_output_dir true it says that it replaces it (a wrong option then stops train.py)."""
    root = Path(__file__).resolve().parents[1]
    earlier = tmp_path / "quickstart_seq2seq"
    earlier.mkdir()
    (earlier / "config.json").write_text("{}")
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    command = [sys.executable, "-m", "hf_outheads.training.quickstart", "--output_root", str(tmp_path), "--head_type", "softmaxx"]
    run = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 2 and run.stdout == "", run.stdout  # not even the language model was trained
    assert run.stderr.strip() == (f"=== quickstart: {earlier} holds the finished model of an earlier run: this run would "
                                  "replace its weights, card, metrics and checkpoints. Keep it with --output_root "
                                  "<another folder>, or replace it with --overwrite_output_dir true.")
    run = subprocess.run([*command, "--task", "seq2seq", "--overwrite_output_dir", "true"], cwd=root, env=env,
                         capture_output=True, text=True, timeout=300)
    assert f"=== quickstart seq2seq: replacing the earlier run in {earlier} (--overwrite_output_dir true)" in run.stdout
    assert run.returncode == 2 and "Unknown head type 'softmaxx'" in run.stderr and (earlier / "config.json").exists()


def test_the_quickstart_trains_told_to_replace_the_earlier_run(tmp_path, monkeypatch, capsys):
    """Its options right, the quickstart trains (in its process) with --overwrite_output_dir true (by hand too)."""
    from hf_outheads.training import quickstart, train

    (tmp_path / "quickstart_seq2seq").mkdir()
    (tmp_path / "quickstart_seq2seq" / "config.json").write_text("{}")
    trained = []
    monkeypatch.setattr(train, "main", lambda options, in_process: trained.append((options, in_process)))
    quickstart.main(["--task", "seq2seq", "--output_root", str(tmp_path), "--overwrite_output_dir", "true",
                     "--max_steps", "1"])
    [(options, in_process)] = trained
    assert in_process and options.training.max_steps == 1 and options.training.overwrite_output_dir
    assert options.training.output_dir == str(tmp_path / "quickstart_seq2seq")
    assert "--overwrite_output_dir true" in capsys.readouterr().out.split("=== by hand:")[1].splitlines()[0]


def test_the_quickstart_checks_its_figures_against_the_stated_ones():
    from hf_outheads.training.quickstart import EXPECTED, check_figures

    stated = {key: value for task in EXPECTED.values() for key, (value, _) in task.items()}
    lm = {"eval_perplexity": stated["eval_perplexity"]}
    seq2seq = {"eval_sacrebleu": stated["eval_sacrebleu"], "eval_chrf": stated["eval_chrf"],
               "eval_copy_sacrebleu": 53.07, "eval_copy_chrf": 84.35}
    assert check_figures("lm", lm) == [] and check_figures("seq2seq", seq2seq) == []
    tolerance = EXPECTED["lm"]["eval_perplexity"][1]
    assert check_figures("lm", {"eval_perplexity": stated["eval_perplexity"] + tolerance * 1.01}) == [
        f"eval_perplexity {stated['eval_perplexity'] + tolerance * 1.01:.2f} is not within {tolerance} of the stated "
        f"{stated['eval_perplexity']}"]
    below_copy = check_figures("seq2seq", {**seq2seq, "eval_copy_chrf": stated["eval_chrf"] + 0.01})
    assert below_copy == [f"eval_chrf {stated['eval_chrf']:.2f} does not beat the copied source's "
                          f"{stated['eval_chrf'] + 0.01:.2f}"]


def test_the_quickstart_prints_each_figure_beside_the_stated_value_and_tolerance():
    """One line per stated figure, with the stated value and tolerance, also when not checked."""
    from hf_outheads.training.quickstart import EXPECTED, figure_lines

    (ppl, ppl_tolerance), (bleu, bleu_tolerance) = EXPECTED["lm"]["eval_perplexity"], EXPECTED["seq2seq"]["eval_sacrebleu"]
    assert figure_lines("lm", {"eval_perplexity": ppl + 0.5}) == [
        f"perplexity {ppl + 0.5:.2f} (stated {ppl} +- {ppl_tolerance}): as stated"]
    seq2seq = {"eval_sacrebleu": bleu - bleu_tolerance - 1, "eval_chrf": EXPECTED["seq2seq"]["eval_chrf"][0],
               "eval_copy_sacrebleu": 53.07, "eval_copy_chrf": 84.35}
    lines = figure_lines("seq2seq", seq2seq)
    assert lines[0] == f"BLEU {bleu - bleu_tolerance - 1:.2f} (stated {bleu} +- {bleu_tolerance}): OFF"
    assert lines[1].startswith("chrF ") and lines[1].endswith(": as stated") and len(lines) == 4
    assert lines[2] == f"BLEU {seq2seq['eval_sacrebleu']:.2f} (stated: above the copied source's 53.07): as stated"
    assert all(line.endswith(": not checked (options given: --max_steps 9)")
               for line in figure_lines("seq2seq", seq2seq, "options given: --max_steps 9"))


def test_the_readmes_state_the_figures_and_tolerances_the_quickstart_checks():
    from hf_outheads.training.quickstart import EXPECTED

    root = Path(__file__).resolve().parents[1]
    training_readme = (root / "training" / "README.md").read_text()
    for metric, (value, tolerance) in {k: v for task in EXPECTED.values() for k, v in task.items()}.items():
        assert f"{value} ± {tolerance}" in training_readme, (metric, value, tolerance)
