"""studies/scale_heads.py, the lean trainer of the scale comparison, at a tiny size: every
head sees the same blocks in the same order, a run that would overrun --budget_s is left for the
next call (predicted from the runs so far) or given up rather than cut short, a finished run is
not trained again, the queue adds second seeds for runs close to the best plain head, and the
runs tabulate (equal steps, equal FLOPs, equal wall time, speed)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from studies import scale_heads
from hf_outheads.training.corpora.debian_docs import pack

TINY = ["--override", "n_layer=1", "--override", "n_embd=16", "--override", "n_head=2", "--override",
        "train_tokens=256", "--override", "batch_size=2", "--override", "evaluations=2", "--override", "eval_blocks=4",
        "--override", "torch_compile=false", "--device", "cpu"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    folder = tmp_path_factory.mktemp("corpus")
    words = "every head sees the same blocks in the same order of the corpus".split()
    rng = np.random.default_rng(0)
    pack([(f"doc{i}", " ".join(rng.choice(words, 60))) for i in range(40)], folder, vocab_size=280, block_size=16,
         validation_percent=20)
    return folder


def test_block_order_is_one_permutation_per_epoch():
    order = scale_heads.block_order(blocks=5, steps=4, batch=3, seed=1)
    assert order.shape == (4, 3)
    flat = order.ravel()
    assert sorted(flat[:5]) == list(range(5)) and sorted(flat[5:10]) == list(range(5))
    assert np.array_equal(order, scale_heads.block_order(5, 4, 3, 1))


def runs_in(folder):
    return [json.loads(line) for line in (folder / "scale_runs.jsonl").read_text().splitlines()]


def test_a_run_over_budget_is_left_and_a_finished_one_is_reused(corpus, tmp_path, capsys):
    out, none = tmp_path / "out", ["--runs", str(tmp_path / "none.jsonl")]  # not the committed runs
    with pytest.raises(SystemExit, match="No runs"):
        scale_heads.main(["--data", str(corpus), "--heads", "tied", "--out", str(out), "--budget_s", "0", *none, *TINY])
    assert "tied (seed 1): given up after" in capsys.readouterr().out
    scale_heads.main(["--data", str(corpus), "--heads", "tied,mos-k1", "--out", str(out), *none, *TINY])
    runs = runs_in(out)
    assert [r["name"] for r in runs] == ["tied", "mos-k1"] and runs[1]["head_options"]["num_components"] == 1
    assert runs[0]["train_tokens"] == runs[1]["train_tokens"] == 8 * 2 * 16
    assert runs[0]["loss_path"] == "full" and runs[1]["loss_path"] == "own fused loss"  # CPU: auto is the full loss
    capsys.readouterr()
    scale_heads.main(["--data", str(corpus), "--heads", "tied", "--out", str(out), "--runs", str(out / "scale_runs.jsonl"),
                      *TINY])
    assert "nothing left in the queue" in capsys.readouterr().out and len(runs_in(out)) == 2
    # a call that starts from those runs: mos (K = 15) is predicted from their rates to overrun a tight budget
    slow = [dict(run, achieved_tflops=run["achieved_tflops"] / 1e4) for run in runs]  # predicted far past the budget
    (tmp_path / "slow.jsonl").write_text("".join(json.dumps(run) + "\n" for run in slow))
    scale_heads.main(["--data", str(corpus), "--heads", "tied,mos", "--out", str(tmp_path / "next"), "--budget_s", "60",
                      "--runs", str(tmp_path / "slow.jsonl"), *TINY])
    assert "mos (seed 1): left for the next call: predicted" in capsys.readouterr().out
    assert [r["name"] for r in runs_in(tmp_path / "next")] == ["tied", "mos-k1"]  # the call's runs: those it started from
    table = tmp_path / "table"
    scale_heads.main(["--tabulate", str(out / "scale_runs.jsonl"), "--out", str(table)])
    text = (table / "results.md").read_text()
    assert text.startswith("Command: `python ") and "| mos-k1 |" in text and "tokens/s" in text
    assert "Equal wall time" in text and "| loss path |" in text


def test_the_queue_adds_second_seeds_close_to_the_best_plain_head():
    cfg = {"seed": 1, "queue": ["tied", "linear", "mos", "lightrnn"]}
    run = lambda name, ppl, seed=1: {"name": name, "seed": seed, "eval_perplexity": ppl}
    assert scale_heads.queue(cfg, [run("tied", 30.0)]) == [("linear", 1), ("mos", 1), ("lightrnn", 1)]
    first = [run("tied", 30.0), run("linear", 28.0), run("mos", 28.5), run("lightrnn", 40.0)]
    assert scale_heads.queue(cfg, first) == [("linear", 2), ("mos", 2)]  # mos within 3% of linear, the best plain
    assert scale_heads.queue(cfg, first + [run("linear", 28.1, 2)]) == [("mos", 2)]
    far = [run("tied", 30.0), run("linear", 28.0), run("mos", 29.0), run("lightrnn", 40.0)]
    assert scale_heads.queue(cfg, far) == []  # nothing within 3%: one seed is the verdict


def test_an_unknown_head_fails_before_training(corpus, tmp_path):
    with pytest.raises(ValueError, match="nohead"):
        scale_heads.main(["--data", str(corpus), "--heads", "tied,nohead", "--out", str(tmp_path), *TINY])
