"""studies/scale_heads.py, the lean trainer of the scale comparison, at a tiny size: every
head sees the same blocks in the same order, a head that would overrun --budget_s is given
up rather than cut short, a finished head is not trained again, and the runs tabulate."""

from __future__ import annotations

import json

import numpy as np
import pytest

from studies import scale_heads
from studies.scale_corpus import pack

TINY = ["--override", "n_layer=1", "--override", "n_embd=16", "--override", "n_head=2", "--override",
        "train_tokens=256", "--override", "batch_size=2", "--override", "evaluations=1", "--override", "eval_blocks=4",
        "--device", "cpu"]


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


def test_a_head_over_budget_is_given_up_and_a_finished_one_is_reused(corpus, tmp_path, capsys):
    with pytest.raises(SystemExit, match="No runs"):
        scale_heads.main(["--data", str(corpus), "--heads", "tied", "--out", str(tmp_path), "--budget_s", "0", *TINY])
    assert "tied: given up after" in capsys.readouterr().out
    scale_heads.main(["--data", str(corpus), "--heads", "tied,mos-k1", "--out", str(tmp_path), *TINY])
    runs = [json.loads(line) for line in (tmp_path / "scale_runs.jsonl").read_text().splitlines()]
    assert [r["name"] for r in runs] == ["tied", "mos-k1"] and runs[1]["head_options"]["num_components"] == 1
    assert runs[0]["train_tokens"] == runs[1]["train_tokens"] == 8 * 2 * 16
    scale_heads.main(["--data", str(corpus), "--heads", "tied", "--out", str(tmp_path), *TINY])
    assert "tied: already in" in capsys.readouterr().out
    assert len((tmp_path / "scale_runs.jsonl").read_text().splitlines()) == 2
    table = tmp_path / "table"
    scale_heads.main(["--tabulate", str(tmp_path / "scale_runs.jsonl"), "--out", str(table)])
    text = (table / "results.md").read_text()
    assert text.startswith("Command: `python ") and "| mos-k1 |" in text and "tokens/s" in text


def test_an_unknown_head_fails_before_training(corpus, tmp_path):
    with pytest.raises(ValueError, match="nohead"):
        scale_heads.main(["--data", str(corpus), "--heads", "tied,nohead", "--out", str(tmp_path), *TINY])
