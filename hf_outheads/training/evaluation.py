"""Evaluation across processes: perplexity from token NLL, and generation metrics.

Perplexity is `exp(sum of token NLL / number of tokens)` over the whole validation split.
Each process sums per example; `gather_for_metrics` drops the samples accelerate repeats
to even out the last batch, so every example counts exactly once. The head's auxiliary
loss (DOC's regulariser) is a training term, not part of the likelihood: it is left out
by scoring the logits directly.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
import torch.nn.functional as F

from hf_outheads import IGNORE_INDEX, next_token_labels

METRICS_DIR = Path(__file__).resolve().parent / "metrics"  # local: evaluate.load("sacrebleu") downloads (fails offline)
# metric module -> the result keys reported (as `eval_<key>`; `score` becomes the module name)
METRIC_KEYS = {"sacrebleu": ("score",), "chrf": ("score",), "rouge": ("rouge1", "rouge2", "rougeL", "rougeLsum")}
# every reported score is on sacrebleu's 0-100 scale; rouge-score gives F-measures in 0-1
METRIC_SCALE = {"rouge": 100.0}
SAMPLING = {"do_sample": True, "top_p": 0.9}  # the causal LM's sample at the end of a run (and the card's usage code)


def load_metric(name: str):
    """An `evaluate` module shipped in hf_outheads/training/metrics (offline)."""
    import evaluate

    if name not in METRIC_KEYS:
        raise ValueError(f"Unknown generation metric {name!r}. Valid metrics: {sorted(METRIC_KEYS)}.")
    return evaluate.load(str(METRICS_DIR / name))


def token_nll(accelerator, model, batch, task: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(NLL of every scored position, its label; -100 where nothing is scored), `(B, T)` each."""
    labels = batch["labels"]
    if task == "causal_lm":
        logits = model(input_ids=batch["input_ids"], attention_mask=batch.get("attention_mask")).logits
        labels = next_token_labels(labels)
    else:
        decoder_input_ids = accelerator.unwrap_model(model).prepare_decoder_input_ids_from_labels(labels)
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                       decoder_input_ids=decoder_input_ids).logits
    return F.cross_entropy(logits.float().transpose(1, 2), labels, ignore_index=IGNORE_INDEX, reduction="none"), labels


@torch.no_grad()
def evaluate_perplexity(accelerator, model, dataloader, task: str, bands=None) -> dict:
    """Perplexity; with `bands` (a `frequency_bands.FrequencyBands`) also per frequency band, as `eval_bands`."""
    model.eval()
    nll_sum, tokens, examples = 0.0, 0, 0
    for batch in dataloader:
        nll, labels = token_nll(accelerator, model, batch, task)
        per_example = (nll.sum(dim=1), (labels != IGNORE_INDEX).sum(dim=1))
        if bands is not None:  # per example, so that gather_for_metrics drops the repeated ones
            per_example += tuple(torch.stack(parts) for parts in zip(*(bands.sums(n, l) for n, l in zip(nll, labels))))
        gathered = accelerator.gather_for_metrics(per_example)
        nll_sum += gathered[0].double().sum().item()
        tokens += int(gathered[1].sum())
        examples += len(gathered[1])
        if bands is not None:
            bands.add(gathered[2], gathered[3])
    model.train()
    if tokens == 0:
        raise ValueError(f"The evaluation covered {examples} examples but 0 label tokens, so it has no perplexity: "
                         "check the validation split, block_size (>= 2) and max_target_length.")
    loss = nll_sum / tokens
    results = {"eval_loss": loss, "eval_perplexity": math.exp(min(loss, 700.0)), "eval_tokens": tokens, "eval_examples": examples}
    return results if bands is None else {**results, "eval_bands": bands.results()}


@torch.no_grad()
def generate_texts(accelerator, model, dataloader, tokenizer, options) -> tuple[list[str], list[str], list[str]]:
    """(sources, predictions, references) decoded on every process, each example once."""
    model.eval()
    sources, predictions, references = [], [], []
    pad = tokenizer.pad_token_id
    for batch in dataloader:
        generated = accelerator.unwrap_model(model).generate(
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
            max_new_tokens=options.data.max_target_length, num_beams=options.training.generation_num_beams, do_sample=False,
        )
        tensors = [accelerator.pad_across_processes(t, dim=1, pad_index=value) for t, value in
                   ((batch["input_ids"], pad), (generated, pad), (batch["labels"], IGNORE_INDEX))]
        inputs, generated, labels = accelerator.gather_for_metrics(tensors)
        labels = labels.masked_fill(labels == IGNORE_INDEX, pad)
        sources += tokenizer.batch_decode(inputs, skip_special_tokens=True)
        predictions += [t.strip() for t in tokenizer.batch_decode(generated, skip_special_tokens=True)]
        references += [t.strip() for t in tokenizer.batch_decode(labels, skip_special_tokens=True)]
    model.train()
    return sources, predictions, references


def generation_scores(metric_names, predictions, references) -> dict:
    """`eval_<metric>` results of the named modules, each in 0-100 (computed in this process only)."""
    results = {}
    for name in metric_names:
        scores = load_metric(name).compute(predictions=predictions, references=[[r] for r in references])
        for key in METRIC_KEYS[name]:
            results[f"eval_{name if key == 'score' else key}"] = float(scores[key]) * METRIC_SCALE.get(name, 1.0)
    return results


def copy_scores(metric_names, sources, references, prefix: str = "") -> dict:
    """`eval_copy_<metric>`: the scores of each source (its `prefix` removed) taken as its own
    prediction, what the task gives for free: a model has learnt the task where it scores above."""
    hypotheses = [s.removeprefix(prefix).strip() for s in sources]
    return {f"eval_copy_{key.removeprefix('eval_')}": value
            for key, value in generation_scores(metric_names, hypotheses, references).items()}


def fit_to_context(tokenizer, prompt: str, max_new_tokens: int, positions: int | None) -> tuple[str, int]:
    """(prompt, max_new_tokens) of a sample that fits the model's `positions` (None: no limit):
    the new tokens are capped at what the context leaves, a prompt that fills it is cut to half of it."""
    if not positions:
        return prompt, max_new_tokens
    ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    if len(ids) >= positions:
        prompt = tokenizer.decode(ids[: positions // 2])
        ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    return prompt, max(min(max_new_tokens, positions - len(ids)), 0)


@torch.no_grad()
def sample_text(model, tokenizer, prompt: str, max_new_tokens: int, seed: int) -> str:
    """A sampled continuation of `prompt` (`SAMPLING`: top-p 0.9, seeded), prompt included; `model` unwrapped."""
    model = model.eval()
    ids = tokenizer(prompt, add_special_tokens=False, return_tensors="pt")["input_ids"].to(model.device)
    torch.manual_seed(seed)
    out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                         pad_token_id=tokenizer.pad_token_id, **SAMPLING)
    return tokenizer.decode(out[0], skip_special_tokens=True)
