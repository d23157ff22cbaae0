"""studies/mtp_speed.py's measurement of a model in memory (`measure_model`, what the scale study calls after its
mtp run) and its report: a drafted generation that differs from plain greedy is said, not hidden."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from studies import mtp_speed
from test_head_mtp import mtp_model, prompts
from tiny import docstring_tokenizer


def test_measure_model_times_both_methods_and_counts_acceptance_per_future_position():
    model = mtp_model("gpt2", num_future=2)
    chosen = prompts(count=2, length=4)
    texts = prompts(count=2, length=10)
    (result,) = mtp_speed.measure_model(model, 0, chosen, texts, new_tokens=6, repeats=1, run="tiny/seed1")
    assert result["token_identical"] and result["run"] == "tiny/seed1" and result["draft_vocabulary"] == "every word"
    assert result["tokens"] == 2 * 6 and min(result["tokens_per_s"].values()) > 0
    assert len(result["acceptance"]) == len(result["text_agreement"]) == 2
    assert sum(result["draft_counts"]["proposed"]) > 0


def test_the_report_names_a_drafted_generation_that_differs(tmp_path):
    model = mtp_model("gpt2", num_future=2)
    (result,) = mtp_speed.measure_model(model, 0, prompts(2, 4), prompts(2, 10), new_tokens=4, repeats=1, run="a/seed1")
    settings = {"prompts": 2, "prompt_tokens": 4, "new_tokens": 4, "repeats": 1}
    mtp_speed.write([result, dict(result, run="b/seed1", token_identical=False, device="NVIDIA H100 80GB HBM3")],
                    tmp_path, "cmd", settings, mtp_speed.machine_of("cpu", 1))
    text = (tmp_path / "speed.md").read_text()
    assert "FAILED: drafted greedy differs from plain greedy on a prompt" in text and "b/seed1 (every word)" in text
    assert "| a/seed1 | cpu |" in text and "| b/seed1 | NVIDIA H100 80GB HBM3 |" in text


def test_the_command_measures_the_saved_runs_of_a_comparison(tmp_path):
    """`python -m studies.mtp_speed RUNS --output_dir OUT` in a fresh process: each `<name>/seed<seed>/` run with an
    `mtp` head is loaded by the Auto classes and measured on the built-in corpus's prompts; speed.md and speed.json
    name it."""
    run = tmp_path / "runs" / "mtp-d2" / "seed1"
    mtp_model("gpt2", num_future=2).save_pretrained(run)
    docstring_tokenizer().save_pretrained(run)
    command = [sys.executable, "-m", "studies.mtp_speed", str(tmp_path / "runs"), "--output_dir", str(tmp_path / "out"),
               "--prompts", "2", "--prompt_tokens", "4", "--new_tokens", "4", "--repeats", "1"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL,
                          cwd=Path(__file__).resolve().parents[1], env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    (result,) = json.loads((tmp_path / "out" / "speed.json").read_text())["runs"]
    assert result["run"].endswith("mtp-d2/seed1") and result["token_identical"]
    assert "mtp-d2/seed1" in (tmp_path / "out" / "speed.md").read_text()
