"""The output-head interface shared by every head, and the options machinery.

A head turns the backbone's final hidden states (and, when it asks for them, the input
embedding matrix or middle-layer states) into next-token scores over the vocabulary.
The model classes only talk to this interface: they read a head's capabilities
(`layer_indices`, `returns_log_probs`) and never branch on its name.
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar, Sequence

import torch
from torch import nn
import torch.nn.functional as F

IGNORE_INDEX = -100


@dataclass(frozen=True)
class HeadDims:
    """Sizes a head is built for, read from the backbone config (see `backbones.head_dims`)."""

    vocab_size: int
    embed_dim: int  # d: width of the input embedding matrix E
    hidden_dim: int  # d_h: width of the backbone's final hidden state
    num_layers: int  # number of backbone layers (hidden_states has num_layers + 1 entries)


@dataclass
class HeadInputs:
    """What the model hands to a head, already restricted to the kept positions."""

    hidden: torch.Tensor  # (..., d_h) final hidden states
    embeddings: torch.Tensor  # (|V|, d) the backbone's (decoder) input embedding matrix
    layers: dict[int, torch.Tensor] = field(default_factory=dict)  # hidden_states[i], i in head.layer_indices
    # None: the head decides (mixtures skip `logits` when training with labels); True: always
    # compute them; False: loss only when labels are given (model forward `return_logits`)
    return_logits: bool | None = None


@dataclass
class HeadOutput:
    """`logits` are scores, or normalised log-probabilities when `head.returns_log_probs`.

    `nll_sum` is the summed negative log-likelihood of the non-ignored labels (the model
    divides by the token count); `aux_loss` is an extra training term (DOC's regulariser).
    """

    logits: torch.Tensor | None = None
    nll_sum: torch.Tensor | None = None
    aux_loss: torch.Tensor | None = None


@dataclass
class HeadOptions:
    """Base class of every head's hyper-parameters. Subclasses add fields with the
    papers' defaults and override `validate` to check them against the backbone."""

    def validate(self, dims: HeadDims) -> None:
        return None

    @classmethod
    def from_dict(cls, head_type: str, options: dict[str, Any] | None) -> "HeadOptions":
        options = dict(options or {})
        valid = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(options) - set(valid))
        if unknown:
            raise ValueError(
                f"Unknown option(s) {unknown} for head '{head_type}'. "
                f"Valid options: {valid or 'none (this head takes no options)'}."
            )
        return cls(**options)


def check_positive(head_type: str, **values: int | float) -> None:
    """Raise a ValueError naming the option if any size is not strictly positive."""
    for name, value in values.items():
        if value is None or value <= 0:
            raise ValueError(f"Head '{head_type}': option '{name}' must be > 0, got {value!r}.")


def check_choice(head_type: str, name: str, value: str, choices: Sequence[str]) -> None:
    if value not in choices:
        raise ValueError(f"Head '{head_type}': option '{name}'={value!r} is not one of {list(choices)}.")


def check_probability(head_type: str, **values: float) -> None:
    for name, value in values.items():
        if not 0.0 <= value < 1.0:
            raise ValueError(f"Head '{head_type}': option '{name}' must be in [0, 1), got {value!r}.")


class OutputHead(nn.Module):
    """Interface of every output head.

    Capabilities the model reads:
      - `layer_indices`: indices into the backbone's `hidden_states` the head needs besides
        the final hidden state (0 = embedding output); empty for most heads.
      - `returns_log_probs`: `logits` holds normalised log-probabilities (mixtures).
    Subclasses implement `forward(inputs, labels) -> HeadOutput` and `init_from_lm_head`;
    `resize_vocab` has a generic default (used by `model.resize_token_embeddings`).
    """

    head_type: ClassVar[str]
    Options: ClassVar[type[HeadOptions]] = HeadOptions
    returns_log_probs: ClassVar[bool] = False

    def __init__(self, options: HeadOptions, dims: HeadDims):
        super().__init__()
        self.options = options
        self.dims = dims
        self.register_load_state_dict_post_hook(_check_loaded_state)

    @property
    def layer_indices(self) -> tuple[int, ...]:
        return ()

    def reset_parameters(self) -> None:
        """Fresh initialisation (from scratch). Must use `transformers.initialization`."""
        raise NotImplementedError

    def init_from_lm_head(self, weight: torch.Tensor, bias: torch.Tensor, embeddings: torch.Tensor) -> bool:
        """Initialise from a pretrained LM head `weight h + bias`; return True when the
        head then reproduces the original scores exactly, False when it cannot."""
        raise NotImplementedError

    def forward(self, inputs: HeadInputs, labels: torch.Tensor | None = None) -> HeadOutput:
        raise NotImplementedError

    def generation_scope(self):
        """Context manager the model enters around each `generate` call, in which nothing the
        head reads changes (single-softmax heads reuse their label matrix). Default: nothing."""
        return contextlib.nullcontext()

    def check_state(self) -> None:
        """Raise a ValueError if loaded values break the head's invariants; called after
        `load_state_dict` and `from_pretrained`. Default: nothing to check."""
        return None

    def plain_lm_head(self, embeddings: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """`(weight, bias)` when this head is a plain `weight h + b` softmax (`tied`, `linear`),
        so that `from_backbone` can convert a model with this head to another head; else None."""
        return None

    def set_word_counts(self, counts: torch.Tensor) -> None:
        """Training-set frequency of every word (`|V|` counts). Training pipelines call it once
        before training, for any head; heads that use word frequencies (a unigram sampling
        proposal, a frequency-sorted code table) override it. Default: unused."""
        return None

    @torch.no_grad()
    def resize_vocab(self, new_size: int) -> None:
        """Resize every per-word tensor (a parameter or buffer of the head itself, not of its
        sub-modules, whose first dimension is the vocabulary size) to `new_size` rows: old rows
        are kept, new rows get the mean of the old ones (so new words start with average
        scores). Sub-modules (projections, priors, latents) never hold per-word rows, whatever
        their sizes. Override for other layouts."""
        old_size = self.dims.vocab_size
        for store in (self._parameters, self._buffers):
            for name, tensor in store.items():
                if tensor is None or tensor.dim() == 0 or tensor.shape[0] != old_size:
                    continue
                rows = tensor[:new_size]
                if new_size > old_size:
                    extra = tensor.mean(0, keepdim=True).expand(new_size - old_size, *tensor.shape[1:])
                    rows = torch.cat([tensor, extra])
                rows = rows.clone()
                store[name] = nn.Parameter(rows, tensor.requires_grad) if isinstance(tensor, nn.Parameter) else rows
        self.dims = dataclasses.replace(self.dims, vocab_size=new_size)


def _check_loaded_state(module: OutputHead, incompatible_keys) -> None:
    module.check_state()


def word_count_vector(head: OutputHead, counts) -> torch.Tensor:
    """`counts` as a 1-d tensor of `|V|` non-negative counts, or a ValueError saying what it got."""
    counts = torch.as_tensor(counts).reshape(-1)
    if counts.numel() != head.dims.vocab_size or counts.is_floating_point() and not torch.isfinite(counts).all():
        raise ValueError(f"Head '{head.head_type}': set_word_counts needs one finite count per word of the "
                         f"{head.dims.vocab_size}-word vocabulary, got {counts.numel()} values.")
    if counts.numel() and counts.min() < 0:
        raise ValueError(f"Head '{head.head_type}': set_word_counts got a negative count ({counts.min().item()}).")
    return counts


def nll_sum_from_logits(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Summed cross-entropy in fp32 over non-ignored labels (works on scores and on log-probs)."""
    return F.cross_entropy(
        logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=IGNORE_INDEX, reduction="sum"
    )
