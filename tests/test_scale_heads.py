"""studies/scale_heads.py, the scale comparison's queue over train.py's runs, at a tiny size: a run
that would overrun --budget_s is left for the next call (predicted from the runs so far) or given up
rather than cut short (a callback of train.py's loop), a finished run is not trained again, the queue
adds second seeds for runs close to the best plain head, and the runs tabulate (equal steps, equal
FLOPs, equal wall time, speed). No test reads a clock against a budget: the budgets are 0 or far below
what the given rates predict."""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

import numpy as np
import pytest

from studies import scale_heads
from hf_outheads.training.corpora.debian_docs import pack

TINY = ["--override", "n_layer=1", "--override", "n_embd=16", "--override", "n_head=2", "--override",
        "train_tokens=256", "--override", "batch_size=2", "--override", "evaluations=2", "--override", "eval_blocks=4",
        "--override", "torch_compile=false"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    folder = tmp_path_factory.mktemp("corpus")
    words = "every head sees the same blocks in the same order of the corpus".split()
    rng = np.random.default_rng(0)
    pack([(f"doc{i}", " ".join(rng.choice(words, 60))) for i in range(40)], folder, vocab_size=280, block_size=16,
         validation_percent=20)
    return folder


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
    # a call that starts from runs of 1 FLOP/s: mos (K = 15) is predicted to take longer than any budget
    slow = [dict(run, achieved_tflops=1e-12, warm_up_s=0.0) for run in runs]
    (tmp_path / "slow.jsonl").write_text("".join(json.dumps(run) + "\n" for run in slow))
    scale_heads.main(["--data", str(corpus), "--heads", "tied,mos", "--out", str(tmp_path / "next"), "--budget_s", "60",
                      "--runs", str(tmp_path / "slow.jsonl"), *TINY])
    assert "mos (seed 1): left for the next call: predicted" in capsys.readouterr().out
    assert [r["name"] for r in runs_in(tmp_path / "next")] == ["tied", "mos-k1"]  # the call's runs: those it started from
    # the table from the runs with fixed step times (1 s and 1.5 s), not the measured ones: "Equal wall time" needs an
    # evaluation of each run before the shortest run's end, which the machine's load would otherwise decide
    fixed = [dict(run, train_step_time_s=seconds) for run, seconds in zip(runs_in(out), (1.0, 1.5))]
    (tmp_path / "fixed.jsonl").write_text("".join(json.dumps(run) + "\n" for run in fixed))
    table = tmp_path / "table"
    scale_heads.main(["--tabulate", str(tmp_path / "fixed.jsonl"), "--out", str(table)])
    text = (table / "results.md").read_text()
    assert text.startswith("Command: `python ") and "| mos-k1 |" in text and "tokens/s" in text
    assert "Equal wall time: each run's curve interpolated at 8 s" in text and "| loss path |" in text


def test_every_run_of_a_call_trains_on_the_same_blocks_in_the_same_order(corpus, tmp_path, monkeypatch):
    """A run's options (train.py's): the corpus's blocks as pre-tokenised data, drawn in the config's seed's order
    whatever the run's seed; the config's schedule, evaluations and logging steps (each a read of the device)."""
    cfg = {**scale_heads.yaml.safe_load(scale_heads.RESULTS.parent.parent.joinpath("configs", "scale_gpt2small.yaml")
                                        .read_text()), "train_tokens": 10 * 32 * 16}
    options = [scale_heads.run_options(cfg, name, seed, corpus, {"train": "t.parquet"}, tmp_path / name)
               for name, seed in (("tied", 1), ("mos", 1), ("tied", 2))]
    assert {o.training.data_seed for o in options} == {cfg["seed"]} and [o.training.seed for o in options] == [1, 1, 2]
    assert [o.model.head.head_type for o in options] == ["tied", "mos", "tied"]
    assert options[1].model.head.options.num_components == 4  # the config's variant
    training = options[0].training
    assert (training.max_steps, training.eval_steps, training.logging_steps) == (10, 2, scale_heads.WARM_STEP)
    assert training.lr_scheduler_type == "cosine_with_min_lr" and training.lr_scheduler_kwargs == {"min_lr_rate": 0.1}
    assert options[0].data.data_files == {"train": "t.parquet"} and options[0].data.block_size == 16


def test_the_budget_gives_a_run_up_after_its_check_step_when_its_end_is_past_the_deadline():
    """`Budget`, train.py's callback: the end predicted from the steps after the warm-up (given times, no clock read
    against them but the deadline's own, minutes away)."""
    progress = SimpleNamespace(step=scale_heads.CHECK_STEP)
    times = [10.0] * scale_heads.WARM_STEP + [1.0] * (scale_heads.CHECK_STEP - scale_heads.WARM_STEP)
    roomy = scale_heads.Budget(time.perf_counter() + 600, steps=20, evaluations=2, eval_batches_per_batch=1)
    roomy(progress, times)  # 5 more steps of 1 s and two evaluations: within 10 minutes
    tight = scale_heads.Budget(time.perf_counter() + 600, steps=2000, evaluations=2, eval_batches_per_batch=1)
    with pytest.raises(scale_heads.GivenUp, match=r"given up after 15 steps: 1.000 s a step would end \d+ s past"):
        tight(progress, times)
    tight(SimpleNamespace(step=scale_heads.CHECK_STEP - 1), times)  # checked at CHECK_STEP only


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


DRAFTING = ["--override", "drafting={prompts: 2, prompt_tokens: 4, new_tokens: 6, repeats: 1}"]


def test_an_mtp_run_measures_its_drafting_against_plain_greedy_after_training(corpus, tmp_path):
    """The config's `mtp-linear` (D = 2, sequential, on `linear`): its row's perplexity is the next-token head's, its
    FLOPs count the predictors, and after it trains its saved model drafts greedily on validation blocks (mtp_speed),
    token-identical to plain greedy, written to speed.md / speed.json and a line of results.md, naming the device."""
    out = tmp_path / "out"
    scale_heads.main(["--data", str(corpus), "--heads", "linear,mtp-linear", "--out", str(out),
                      "--runs", str(tmp_path / "none.jsonl"), *TINY, *DRAFTING])
    linear, mtp = runs_in(out)
    assert mtp["head"] == "mtp" and mtp["head_options"]["num_future"] == 2 and mtp["head_options"]["form"] == "sequential"
    assert mtp["head_options"]["head"] == "linear" and "drafting" not in linear
    assert mtp["train_flops"] > linear["train_flops"] and mtp["eval_tokens"] == linear["eval_tokens"]
    (result,) = mtp["drafting"]["results"]
    assert result["token_identical"] and result["run"] == "mtp-linear/seed1" and result["device"] == "cpu"
    assert len(result["acceptance"]) == 2 and result["tokens"] == 2 * 6 and result["speed_up"] > 0
    speed = json.loads((out / "speed.json").read_text())
    assert [r["run"] for r in speed["runs"]] == ["mtp-linear/seed1"] and speed["settings"]["new_tokens"] == 6
    text = (out / "speed.md").read_text()
    assert "the scale corpus's first validation blocks" in text and "token-identical to plain greedy" in text
    assert "| mtp-linear/seed1 | cpu | every word |" in text
    results = (out / "results.md").read_text()
    assert "- mtp-linear (seed 1), cpu, drafts from every word: " in results and "token-identical, acceptance t+2" in results


def test_drafting_that_would_end_past_the_budget_is_skipped_with_a_line(corpus, tmp_path, capsys):
    """A deadline already passed: the measurement is predicted (from a timed generation) and skipped, said in the
    run's row and in results.md's drafting lines."""
    from hf_outheads import OutHeadsConfig, OutHeadsForCausalLM
    from tiny import tiny_config

    text_config = tiny_config("gpt2")
    text_config.vocab_size = 300  # the corpus's ids
    config = OutHeadsConfig(text_config=text_config, head_type="mtp", head_options={"num_future": 2, "num_attention_heads": 2})
    OutHeadsForCausalLM(config).save_pretrained(tmp_path / "model")
    settings = {"prompts": 2, "prompt_tokens": 4, "new_tokens": 6, "repeats": 1}
    drafting = scale_heads.drafting_speed(tmp_path / "model", "mtp/seed1", settings, corpus, time.perf_counter())
    assert set(drafting) == {"skipped"} and "left of --budget_s" in capsys.readouterr().out
    (line,) = scale_heads.drafting_lines([{"name": "mtp", "seed": 1, "drafting": drafting}])
    assert line.startswith("- mtp (seed 1): drafting speed not measured: predicted ")


def test_drafting_settings_longer_than_a_block_fail_before_training(corpus, tmp_path, capsys):
    with pytest.raises(SystemExit):
        scale_heads.main(["--data", str(corpus), "--heads", "tied,mtp-linear", "--out", str(tmp_path / "out"), *TINY,
                          "--override", "drafting={prompts: 1, prompt_tokens: 10, new_tokens: 10, repeats: 1}"])
    assert "prompt_tokens + new_tokens (10 + 10) exceeds the corpus's block size (16)" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
