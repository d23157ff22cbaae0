"""`benchmarks/gpu_run.sh --tiny`: every part of the GPU command end to end on the CPU, at
tiny sizes. What it proves: the script, its steps' command lines and every file they write
work (the head list from the package's catalog, the benchmark of every head against tied,
the loss comparison, the FSDP2 config's one-process launch (on a CPU it must stop with
train.py's message), the corpus packing and the
scale comparison of every head at equal tokens), so that a GPU call spends its time
measuring. What it cannot prove: anything about CUDA (the CUDA tests are collected and
skipped here), speed, the wheels' install (skipped with --tiny) or FSDP sharding (one CPU
process is not sharded; tests/test_fsdp.py shards on two)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCALE_HEADS = {2: ["tied", "sigsoftmax", "linear"], 3: ["mos", "mos-k1", "lightrnn", "drill-own", "doc"]}


@pytest.fixture(scope="module")
def out(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu_run")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "PYTHON": os.environ.get("PYTHON", "python")}
    done = subprocess.run([str(ROOT / "benchmarks" / "gpu_run.sh"), str(out), "--tiny"], env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    return out


def test_every_step_of_every_part_ran(out):
    for part in (1, 2, 3):
        log = (out / f"part{part}.log").read_text()
        steps = [line for line in log.splitlines() if line.startswith("=== ") and ": exit " in line]
        assert steps and all(": exit 0 " in line for line in steps), (part, steps)
        assert f"=== part {part} done: 0 failed" in log


def test_the_benchmark_measures_every_catalog_head_against_tied(out):
    from hf_outheads import HEAD_CLASSES

    rows = {}
    for line in (out / "bench_512.md").read_text().splitlines():
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        if len(cells) > 4 and cells[0] == "512":
            rows[cells[2]] = cells
    assert set(rows) == {*HEAD_CLASSES, "backbone", "mos-reference"}
    for head, cells in rows.items():
        assert float(cells[3]) > 0 and cells[4].endswith("x"), (head, cells)  # step time and its ratio to tied
    assert rows["tied"][5] == "1.00x" and rows["mos"][5].endswith("x") and rows["doc"][5].endswith("x")  # vs floor
    assert float(rows["mos"][10].rstrip("x")) > 0  # generation against tied


def test_the_loss_comparison_lists_every_peer(out):
    names = {line.split("|")[3].strip(): line for line in (out / "loss.md").read_text().splitlines()
             if line.startswith("| 512 |")}
    assert set(names) == {"hf_outheads", "naive", "torch", "liger", "cce"}
    for name in ("hf_outheads", "naive"):  # the package's loss equals the full logits' loss
        diff = names[name].split("|")[8].strip()
        assert diff == "-" or float(diff) < 1e-4, names[name]


def test_the_fsdp2_launch_stops_on_a_cpu(out):
    """On the GPU the step trains with FSDP; on a CPU accelerate cannot shard, so the same launch
    must stop before training with train.py's message (no silent unsharded run)."""
    log = (out / "fsdp.log").read_text()
    assert "FSDP2 launch, tied: refused on a CPU" in log and "exit 0 after" in log.split("refused on a CPU")[-1]
    assert "asks for FSDP sharding" in log and "Nothing was trained" in log


def test_the_scale_comparison_trains_every_head_on_equal_tokens(out):
    runs = {}
    for part, heads in SCALE_HEADS.items():
        folder = out / f"scale{part}"
        assert sorted(p.name for p in folder.iterdir()) == ["results.json", "results.md", "scale_runs.jsonl"]
        assert (folder / "results.md").read_text().startswith("Command: `python ")
        part_runs = [json.loads(line) for line in (folder / "scale_runs.jsonl").read_text().splitlines()]
        assert [run["name"] for run in part_runs] == heads
        runs.update({run["name"]: run for run in part_runs})
    assert len({run["train_tokens"] for run in runs.values()}) == 1  # equal tokens for every head
    vocab = json.loads((out / "tiny_corpus" / "corpus.json").read_text())["vocab_size"]
    for name, run in runs.items():
        assert 1 < run["eval_perplexity"] < 2 * vocab, name
        assert sum(band["tokens"] for band in run["eval_bands"].values()) == run["eval_tokens"], name
        assert run["train_flops"] > 0 and run["tokens_per_s"] > 0, name
    assert runs["mos"]["train_flops"] > 2 * runs["mos-k1"]["train_flops"]  # K = 15 components cost more


def test_each_part_fits_what_a_device_call_returns(out):
    """At most 8 files come back from one call (the limit); each part writes at most 6."""
    per_part = {1: ["part1.log", "bench_512.md"], 2: ["part2.log", "loss.md", "fsdp.log", "scale2"], 3: ["part3.log", "scale3"]}
    for part, names in per_part.items():
        files = [f for name in names for f in ((out / name).rglob("*") if (out / name).is_dir() else [out / name])]
        assert all(f.exists() for f in files) and len(files) <= 6, (part, files)
