"""Perplexity by word-frequency band, the analysis of the DRILL paper (Pappas & Henderson 2019,
Sec. 4.1, Fig. 3): words are grouped by how often they occur in the training set, and the
cross-entropy of the evaluation tokens whose label falls in each group is reported apart, so
that a head's gain on rare words (where output structure should transfer information from
other words) is not hidden by the frequent ones, which dominate the overall perplexity.

    bands = FrequencyBands(train_counts)              # |V| training-set counts
    bands.update(token_nll, labels)                   # any number of batches
    bands.results()  # {"rare": {"perplexity": ..., "tokens": ..., "words": ...}, "medium": ..., "frequent": ...}

or, for a model and batches in one call, `frequency_band_perplexity(model, batches, counts)`.
"""

from __future__ import annotations

import math
from typing import Iterable, Sequence

import torch
import torch.nn.functional as F

from hf_outheads.head_interface import IGNORE_INDEX, next_token_labels

DEFAULT_EDGES = (100, 1000)  # training occurrences: rare < 100 <= medium < 1000 <= frequent
DEFAULT_NAMES = ("rare", "medium", "frequent")


class FrequencyBands:
    """Accumulates the summed NLL and the token count of each band. `edges` are increasing
    training-count boundaries: a word with count `c` is in band `i` where `edges[i-1] <= c <
    edges[i]`; `names` has one name more than `edges`."""

    def __init__(self, word_counts, edges: Sequence[int] = DEFAULT_EDGES, names: Sequence[str] = DEFAULT_NAMES):
        counts = torch.as_tensor(word_counts).reshape(-1)
        if len(names) != len(edges) + 1:
            raise ValueError(f"FrequencyBands needs one name more than edges: {len(edges)} edges, names {list(names)}.")
        if list(edges) != sorted(set(edges)):
            raise ValueError(f"FrequencyBands edges must be strictly increasing, got {list(edges)}.")
        if counts.numel() == 0 or (counts < 0).any():
            raise ValueError("FrequencyBands needs one non-negative training count per word of the vocabulary.")
        self.names = tuple(names)
        self.edges = tuple(edges)
        self.band_of = torch.bucketize(counts.double(), torch.tensor(edges, dtype=torch.float64), right=True)
        self.words = torch.bincount(self.band_of, minlength=len(self.names))
        self.nll = torch.zeros(len(self.names), dtype=torch.float64)
        self.tokens = torch.zeros(len(self.names), dtype=torch.long)

    def sums(self, token_nll: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-band (summed NLL, token count) of one batch, `(bands,)` each; `labels` of -100 are skipped."""
        keep = labels != IGNORE_INDEX
        if keep.any() and int(labels[keep].max()) >= self.band_of.numel():
            raise ValueError(f"A label ({int(labels[keep].max())}) is outside the {self.band_of.numel()}-word "
                             "vocabulary the training counts were given for.")
        band = self.band_of.to(labels.device)[labels[keep]]
        nll = torch.zeros(len(self.names), dtype=torch.float64, device=labels.device)
        nll.index_add_(0, band, token_nll[keep].double())
        return nll, torch.bincount(band, minlength=len(self.names))

    def add(self, nll_sums: torch.Tensor, token_counts: torch.Tensor) -> None:
        """Adds per-band sums (from `sums`, possibly gathered over processes and summed)."""
        self.nll += nll_sums.detach().double().cpu().reshape(-1, len(self.names)).sum(0)
        self.tokens += token_counts.detach().long().cpu().reshape(-1, len(self.names)).sum(0)

    def update(self, token_nll: torch.Tensor, labels: torch.Tensor) -> None:
        self.add(*self.sums(token_nll, labels))

    def results(self) -> dict[str, dict]:
        """Per band: perplexity (None without tokens), evaluation tokens, vocabulary words, count range."""
        out = {}
        bounds = (0, *self.edges, None)
        for i, name in enumerate(self.names):
            tokens = int(self.tokens[i])
            ppl = math.exp(min(self.nll[i].item() / tokens, 700.0)) if tokens else None
            out[name] = {"perplexity": ppl, "tokens": tokens, "words": int(self.words[i]),
                         "train_count_range": [bounds[i], bounds[i + 1]]}
        return out


@torch.no_grad()
def frequency_band_perplexity(model, batches: Iterable[dict], word_counts, edges: Sequence[int] = DEFAULT_EDGES,
                              names: Sequence[str] = DEFAULT_NAMES) -> dict[str, dict]:
    """Perplexity per training-frequency band of any causal LM or seq2seq model (an `OutHeads*`
    model or a plain transformers one) over `batches` of `input_ids`, `labels` (-100 skipped)
    and optionally `attention_mask`. Causal LMs predict the next token of each prefix (labels are
    the inputs, shifted by `next_token_labels`, as transformers' causal LM loss); seq2seq models
    score `labels` with the decoder inputs `model.prepare_decoder_input_ids_from_labels(labels)`."""
    bands = FrequencyBands(word_counts, edges, names)
    was_training = model.training
    model.eval()
    seq2seq = bool(getattr(model.config, "is_encoder_decoder", False))
    try:
        for batch in batches:
            batch = {k: v.to(model.device) for k, v in batch.items() if k in ("input_ids", "attention_mask", "labels")}
            labels = batch.pop("labels")
            if seq2seq:
                logits = model(**batch, decoder_input_ids=model.prepare_decoder_input_ids_from_labels(labels)).logits
            else:
                logits, labels = model(**batch).logits, next_token_labels(labels)
            nll = F.cross_entropy(logits.float().transpose(1, 2), labels, ignore_index=IGNORE_INDEX, reduction="none")
            bands.update(nll, labels)
    finally:
        model.train(was_training)
    return bands.results()
