"""The training scripts really launched with `accelerate launch` (tiny models, a few steps):
the files they write, two processes, resumption, loading the result, the model card."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from huggingface_hub import ModelCard
from safetensors.torch import load_file

import hf_outheads.configuration_outheads  # noqa: F401  (registers the Auto classes)
from subprocess_runs import run
from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM, AutoTokenizer

ROOT = Path(__file__).resolve().parents[1]
ENV = {**{k: v for k, v in os.environ.items() if k != "ACCELERATE_USE_CPU"}, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}
ONE_PROCESS = ["--num_processes", "1", "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]
TWO_PROCESSES = ["--multi_gpu", "--num_processes", "2", "--num_machines", "1", "--mixed_precision", "no",
                 "--dynamo_backend", "no", "--main_process_port", "29533"]
TINY_LM = dict(task="causal_lm", model_preset="gpt2-tiny", model_overrides={"n_embd": 32, "n_layer": 1, "n_head": 2},
               dataset_name="stdlib_docstrings", dataset_config="text", max_train_samples=300, max_eval_samples=40,
               tokenizer="bpe", tokenizer_vocab_size=400, block_size=32, per_device_train_batch_size=4,
               per_device_eval_batch_size=8, learning_rate=1e-3, dropout=0.0, logging_steps=2, report_to="none")
N_PAIRS = 37  # odd, and not a multiple of 2 processes x batch size: accelerate pads the last batch


def launch(config: dict, tmp_path: Path, *overrides: str, launch_args=ONE_PROCESS, name="run") -> subprocess.CompletedProcess:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    command = [sys.executable, "-m", "accelerate.commands.launch", *launch_args, "-m", "hf_outheads.training.train", "--config", str(path), *overrides]
    done = run(command, env=ENV, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    return done


def metrics(output_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (output_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def causal_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("causal")
    out = tmp / "out"
    config = {**TINY_LM, "output_dir": str(out), "max_steps": 6, "eval_steps": 3, "save_steps": 3,
              "mixed_precision": "bf16", "gradient_checkpointing": True}  # both work on CPU
    done = launch(config, tmp)
    return out, done.stdout


@pytest.fixture(scope="module")
def seq2seq_run(tmp_path_factory):
    """Two processes on CPU, seq2seq from local JSON-lines files."""
    tmp = tmp_path_factory.mktemp("seq2seq")
    words = "alpha beta gamma delta epsilon zeta eta theta iota kappa".split()
    for split, count in (("train", 60), ("validation", N_PAIRS)):
        rows = [{"question": " ".join(words[(i + j) % 10] for j in range(4)), "answer": " ".join(words[(i + j) % 10] for j in (3, 2, 1, 0))}
                for i in range(count)]
        (tmp / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp / "out"
    config = dict(task="seq2seq", model_preset="t5-tiny",
                  model_overrides={"d_model": 32, "d_ff": 64, "d_kv": 8, "num_layers": 1, "num_heads": 2},
                  data_files={"train": str(tmp / "train.jsonl"), "validation": str(tmp / "validation.jsonl")},
                  source_column="question", target_column="answer", tokenizer="wordlevel", tokenizer_vocab_size=14,
                  tokenizer_min_frequency=1, max_source_length=8, max_target_length=8, per_device_train_batch_size=4,
                  per_device_eval_batch_size=4, max_steps=4, eval_steps=2, save_steps=2, logging_steps=1, dropout=0.0,
                  generation_metrics=["sacrebleu", "chrf"], output_dir=str(out), report_to="none")
    done = launch(config, tmp, launch_args=TWO_PROCESSES)
    return out, done.stdout


@pytest.mark.parametrize("run", ["causal_run", "seq2seq_run"])
def test_run_writes_model_tokenizer_card_and_log(run, request):
    out, stdout = request.getfixturevalue(run)
    for name in ("model.safetensors", "config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                 "README.md", "metrics.jsonl", "eval_results.json", "training_curve.png", "modeling_outheads.py"):
        assert (out / name).is_file(), name
    assert "validation perplexity" in stdout and f"model card: {out / 'README.md'}" in stdout
    records = metrics(out)
    assert records[0]["event"] == "start" and records[-1]["event"] == "final"
    assert any("train_loss" in r for r in records) and sum("eval_perplexity" in r for r in records) >= 2
    assert list((out / "checkpoints").glob("checkpoint_*"))


def test_two_processes_evaluate_every_example_once(seq2seq_run):
    out, _ = seq2seq_run
    records = metrics(out)
    assert records[0]["num_processes"] == 2 and records[0]["validation_examples"] == N_PAIRS
    evals = [r for r in records if "eval_examples" in r]
    assert evals and all(r["eval_examples"] == N_PAIRS and r["eval_generated"] == N_PAIRS for r in evals)
    assert all(r["eval_tokens"] == N_PAIRS * 5 for r in evals)  # 4 answer words + </s> per pair
    # the copy baseline: every validation question scored as its own answer, once per evaluation
    from hf_outheads.training.evaluation import copy_scores

    pairs = [json.loads(line) for line in (out.parent / "validation.jsonl").read_text().splitlines()]
    copy = copy_scores(["sacrebleu", "chrf"], [p["question"] for p in pairs], [p["answer"] for p in pairs])
    assert all(r[key] == pytest.approx(value) for r in evals if "eval_sacrebleu" in r for key, value in copy.items())
    assert sum("eval_copy_sacrebleu" in r for r in evals) >= 2


def test_trained_folders_load_with_auto_classes_and_generate(causal_run, seq2seq_run):
    for (out, _), auto in ((causal_run, AutoModelForCausalLM), (seq2seq_run, AutoModelForSeq2SeqLM)):
        model, tokenizer = auto.from_pretrained(out).eval(), AutoTokenizer.from_pretrained(out)
        ids = tokenizer("alpha beta gamma delta", add_special_tokens=False, return_tensors="pt")["input_ids"]
        generated = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=4, do_sample=False)
        assert generated.shape[0] == 1 and generated.shape[1] >= 2
        assert model.config.head_type == "tied" and len(tokenizer) == model.config.vocab_size


@pytest.mark.parametrize("run", ["causal_run", "seq2seq_run"])
def test_card_metadata_parses_and_matches_the_metrics_log(run, request):
    out, _ = request.getfixturevalue(run)
    card = ModelCard.load(out / "README.md")
    final = metrics(out)[-1]
    reported = {result.metric_name: result.metric_value for result in card.data.eval_results}
    assert reported["Perplexity"] == pytest.approx(final["eval_perplexity"], abs=1e-4)
    if "eval_sacrebleu" in final:
        assert reported["BLEU (sacrebleu)"] == pytest.approx(final["eval_sacrebleu"], abs=1e-4)
        assert reported["chrF"] == pytest.approx(final["eval_chrf"], abs=1e-4)
    assert "outheads-tied" in card.data.tags and "@inproceedings" in card.text
    assert "![training curve](training_curve.png)" in card.text


def test_interrupted_and_resumed_run_ends_with_the_same_weights(tmp_path):
    config = {**TINY_LM, "max_train_samples": 60, "max_steps": 8, "save_steps": 3, "gradient_accumulation_steps": 2,
              "generation_metrics": []}
    launch({**config, "output_dir": str(tmp_path / "whole")}, tmp_path, name="whole")
    resumed = tmp_path / "resumed"
    first = launch({**config, "output_dir": str(resumed), "stop_after_steps": 5}, tmp_path, name="first")
    assert "Stopped after step 5" in first.stdout and not (resumed / "model.safetensors").exists()
    second = launch({**config, "output_dir": str(resumed)}, tmp_path, name="second")
    assert "Resumed from" in second.stdout + second.stderr
    whole, again = load_file(tmp_path / "whole" / "model.safetensors"), load_file(resumed / "model.safetensors")
    assert whole.keys() == again.keys()
    for key in whole:
        torch.testing.assert_close(again[key], whole[key], rtol=0, atol=0, msg=key)
    steps = [r["step"] for r in metrics(resumed) if "train_loss" in r]
    assert steps == sorted(set(steps)) == [r["step"] for r in metrics(tmp_path / "whole") if "train_loss" in r]


def test_head_comparison_trains_each_head_and_writes_the_table(tmp_path):
    config = tmp_path / "compare.yaml"
    config.write_text(yaml.safe_dump({**TINY_LM, "max_train_samples": 40, "max_steps": 2, "eval_steps": 1,
                                      "head_options_by_head": {"bilinear": {}}, "output_dir": str(tmp_path / "out")}))
    command = [sys.executable, "-m", "studies.compare_heads", "--config", str(config), "--heads", "tied,bilinear"]
    done = run(command, env=ENV, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    table = (tmp_path / "out" / "results.md").read_text()
    assert table.startswith("Command: `python -m studies.compare_heads --config ") and "| tied |" in table and "| bilinear |" in table
    rows = json.loads((tmp_path / "out" / "results.json").read_text())["rows"]
    assert [row["name"] for row in rows] == ["tied", "bilinear"]
    assert rows[0]["head_parameters"] < rows[1]["head_parameters"] and all(row["eval_perplexity"][0] > 1 for row in rows)
    assert (tmp_path / "out" / "curves.png").is_file() and (tmp_path / "out" / "bilinear" / "seed42" / "README.md").is_file()


def test_reevaluate_reproduces_the_final_evaluation_of_a_saved_run(seq2seq_run):
    """studies/reevaluate.py loads the saved model as it is (no conversion) with the run's
    own data options: with no new options it reproduces the run's final evaluation."""
    from studies.reevaluate import reevaluate

    out, _ = seq2seq_run
    again = reevaluate(out, [], config=out.parent / "run.yaml")
    final = json.loads((out / "eval_results.json").read_text())
    assert again["eval_generated"] == final["eval_generated"] == N_PAIRS
    for key in ("eval_perplexity", "eval_sacrebleu", "eval_chrf"):
        assert again[key] == pytest.approx(final[key], rel=1e-6), key
    assert (out / "eval_results_again.json").is_file()
