"""`maintainer/gpu_run.sh --tiny`: both parts of the GPU command end to end on the CPU, at tiny
sizes. What it proves: the script, its steps' command lines and every file they write work (the
head list from the package's catalog, every head against tied, the loss comparison, train.py
compiled, the corpus packing and the scale queue of every head at equal tokens, compiled), so
that a GPU call spends its time measuring. What it cannot prove: anything about CUDA (the CUDA
tests are collected and skipped here), speed, or the wheels' install (skipped with --tiny)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
QUEUE = yaml.safe_load((ROOT / "studies" / "configs" / "scale_gpt2small.yaml").read_text())["queue"]  # in its order


@pytest.fixture(scope="module")
def out(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu_run")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "PYTHON": os.environ.get("PYTHON", "python")}
    done = subprocess.run([str(ROOT / "maintainer" / "gpu_run.sh"), str(out), "--part", "all", "--tiny"], env=env,
                          capture_output=True, text=True, timeout=1500)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    return out


def test_every_step_of_every_part_ran(out):
    for part in ("bench", "scale"):
        log = (out / f"{part}.log").read_text()
        steps = [line for line in log.splitlines() if line.startswith("=== ") and ": exit " in line]
        assert steps and all(": exit 0 " in line for line in steps), (part, steps)
        assert f"=== part {part}: 0 failed step(s)" in log
    log = (out / "vllm.log").read_text()  # vLLM's part: measured where vLLM is installed, said so where not
    assert "=== part vllm: 0 failed step(s)" in log
    assert ("vLLM served tokens/s, tied against mos: exit 0 " in log) != ("=== vLLM is not installed here" in log), log


def table(path: Path, vocab: str = "512") -> dict[str, list[str]]:
    rows = {}
    for line in path.read_text().splitlines():
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        if len(cells) > 4 and cells[0] == vocab:
            rows[cells[2]] = cells
    return rows


def test_the_benchmark_measures_every_catalog_head_against_tied(out):
    from hf_outheads import HEAD_CLASSES

    rows = table(out / "heads_512.md")
    assert set(rows) == {*HEAD_CLASSES, "backbone", "tied-own"}
    for head, cells in rows.items():
        assert float(cells[3]) > 0 and cells[4].endswith("x"), (head, cells)  # step time and its ratio to tied
    assert rows["tied-own"][5] in ("1.00x", "-")  # the floor's base (the mixtures' own kernels); "-": a noisy CPU
    assert set(table(out / "heads_gpt2small.md")) == {"tied", "backbone", "tied-own", "sigsoftmax", "mos", "doc"}
    assert "backbone gpt2-tiny" in (out / "heads_gpt2small.md").read_text()
    assert "Profile of one `mos` training step, |V| = 512" in (out / "heads_gpt2small.md").read_text()


def test_the_loss_comparison_lists_every_peer(out):
    names = {line.split("|")[3].strip(): line for line in (out / "loss.md").read_text().splitlines()
             if line.startswith("| 512 |")}
    assert set(names) == {"hf_outheads (auto: torch)", "hf_outheads own", "hf_outheads own, chunk 2^12", "naive", "torch",
                          "liger", "cce"}
    for name in ("hf_outheads (auto: torch)", "hf_outheads own", "hf_outheads own, chunk 2^12", "naive"):
        # the package's loss equals the full logits'
        diff = names[name].split("|")[8].strip()
        assert diff == "-" or float(diff) < 1e-4, names[name]
    assert "kernels fastest first" in (out / "loss.md").read_text()


def test_train_py_ran_compiled(out):
    log = (out / "train.log").read_text()
    assert "validation perplexity" in log and "=== train.py:" in (out / "bench.log").read_text()


def test_the_scale_queue_trains_every_head_on_equal_tokens_and_their_second_seeds(out):
    folder = out / "scale"
    assert sorted(p.name for p in folder.iterdir()) == ["results.json", "results.md", "scale_runs.jsonl", "speed.json",
                                                        "speed.md"]
    assert (folder / "results.md").read_text().startswith("Command: `python ")
    runs = [json.loads(line) for line in (folder / "scale_runs.jsonl").read_text().splitlines()]
    assert [run["name"] for run in runs if run["seed"] == 1] == QUEUE and all(run["torch_compile"] for run in runs)
    assert all(run["seed"] == 2 for run in runs[len(QUEUE):])  # second seeds, only after the first pass
    assert len({run["train_tokens"] for run in runs}) == 1  # equal tokens for every head
    vocab = json.loads((out / "tiny_corpus" / "corpus.json").read_text())["vocab_size"]
    for run in runs:
        assert 1 < run["eval_perplexity"] < 2 * vocab, run["name"]
        assert sum(band["tokens"] for band in run["eval_bands"].values()) == run["eval_tokens"], run["name"]
        assert run["train_flops"] > 0 and run["tokens_per_s"] > 0 and run["loss_path"], run["name"]
        assert "OUT" in run["command"] and "/tmp" not in run["command"]  # no machine's path recorded
    by_name = {run["name"]: run for run in runs if run["seed"] == 1}
    assert by_name["mos"]["train_flops"] > 2 * by_name["mos-k1"]["train_flops"]  # K = 4 components cost more
    assert by_name["mtp-linear"]["train_flops"] > by_name["linear"]["train_flops"]  # its predictors count


def test_the_mtp_run_drafts_token_identically_after_training_in_the_same_call(out):
    """After the queue's mtp run: greedy drafting against plain greedy on the corpus's validation blocks, in speed.json
    (token-identical, tokens/s of both, acceptance per future position) and a line of results.md."""
    speed = json.loads((out / "scale" / "speed.json").read_text())
    runs = [json.loads(line) for line in (out / "scale" / "scale_runs.jsonl").read_text().splitlines()]
    assert [r["run"] for r in speed["runs"]] == [f"{run['name']}/seed{run['seed']}" for run in runs if run["head"] == "mtp"]
    for result in speed["runs"]:
        assert result["token_identical"] and result["device"] == "cpu" and result["tokens"] > 0
        assert min(result["tokens_per_s"].values()) > 0 and len(result["acceptance"]) == 2
        assert all(a is None or 0 <= a <= 1 for a in result["acceptance"])
    assert "Every drafted generation was token-identical" in (out / "scale" / "speed.md").read_text()
    assert "- mtp-linear (seed 1), cpu, drafts from every word: " in (out / "scale" / "results.md").read_text()


def test_each_part_fits_what_a_device_call_returns(out):
    """At most 8 files come back from one call (the limit)."""
    per_part = {"bench": ["bench.log", "loss.md", "heads_512.md", "heads_gpt2small.md", "train.log"],
                "scale": ["scale.log", "scale"], "vllm": ["vllm.log"]}
    for part, names in per_part.items():
        files = [f for name in names for f in ((out / name).rglob("*") if (out / name).is_dir() else [out / name])]
        assert all(f.exists() for f in files) and len(files) <= 8, (part, files)
