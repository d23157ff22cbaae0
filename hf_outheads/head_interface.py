"""The output-head interface shared by every head (options: `head_options.py`).

A head turns the backbone's final hidden states (and, when it asks for them, the input
embedding matrix or middle-layer states) into next-token scores over the vocabulary.
The model classes only talk to this interface: they read a head's capabilities
(`layer_indices`, `returns_log_probs`) and never branch on its name.
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass, field
from typing import Callable, ClassVar

import torch
from torch import nn
import torch.nn.functional as F
from transformers import initialization as init

from transformers.utils import ModelOutput

from .loss_kernels import own_path
from .head_options import HeadDims, HeadOptions

IGNORE_INDEX = -100  # labels the loss skips (transformers' convention)


def next_token_labels(labels: torch.Tensor) -> torch.Tensor:
    """The causal shift: the label of position t is token t + 1, and the last position scores
    nothing (-100), as transformers' causal LM loss pads and shifts `labels` (the input ids)."""
    return F.pad(labels, (0, 1), value=IGNORE_INDEX)[..., 1:]


@dataclass
class HeadInputs:
    """What the model hands to a head, already restricted to the kept positions."""

    hidden: torch.Tensor  # (..., d_h) final hidden states
    embeddings: torch.Tensor  # (|V|, d) the backbone's (decoder) input embedding matrix
    layers: dict[int, torch.Tensor] = field(default_factory=dict)  # hidden_states[i], i in head.layer_indices
    # the (decoder) input token ids at the kept positions; None when the model got embeddings instead
    token_ids: torch.Tensor | None = None
    # None: the head decides (mixtures skip `logits` when training with labels); True: always
    # compute them; False: loss only when labels are given (model forward `return_logits`)
    return_logits: bool | None = None


@dataclass
class HeadOutput(ModelOutput):
    """`logits` are scores, or normalised log-probabilities when `head.returns_log_probs`.

    `nll_sum` is the summed negative log-likelihood of the non-ignored labels (the model
    divides by the token count); `extra_nll_sum` a further (weighted) per-token training term,
    summed, that the model divides by the same count and adds to `loss` in training, never to `nll_loss` (the
    `mtp` head's future tokens, the z-loss): it sums over micro-batches and processes as
    `nll_sum` does (only the gradient of the two together is defined: a fused loss computes it
    in one pass and hands it over with `nll_sum`); `aux_loss` is an extra training term that is a mean over its micro-batch
    (DOC's regulariser); outside training the model's `loss` is the NLL alone, whatever the head returns;
    `aux_terms` names the parts of the extra terms, detached, for logging
    (`{"mtp_nll_1": ..., ...}`; None: nothing to log apart).
    A `ModelOutput` (a dict), so that libraries that hook module outputs find its tensors:
    DeepSpeed ZeRO-3 gathers the head's parameters again before the head's backward by a hook
    on them (on a plain dataclass it finds none, and the backward meets partitioned, empty
    weights). In the forward, ZeRO-3 gathers what the head reads of other modules (`E`, its
    sub-modules' weights) itself: a partitioned parameter read as a module attribute during a
    forward is registered as an external parameter of the module running.
    """

    logits: torch.Tensor | None = None
    nll_sum: torch.Tensor | None = None
    extra_nll_sum: torch.Tensor | None = None
    aux_loss: torch.Tensor | None = None
    aux_terms: dict[str, torch.Tensor] | None = None


@dataclass(frozen=True)
class Paper:
    """A paper a head implements: its card's `arxiv:<id>` tag (None: not on arXiv) and citation."""

    title: str
    url: str
    bibtex: str
    arxiv: str | None = None


class OutputHead(nn.Module):
    """Interface of every output head.

    Facts every head class states about itself, from which the catalog's users derive their
    lists (model cards, benchmarks, the export's capability table, the README's tables, the
    contract and sharded-training tests), so that a new head is its own file (its class decorated
    with `register_head`) plus its line in `head_catalog.py`:
      - `head_type`: its name, stated once: its `Options` class (its own, a `HeadOptions`
        subclass) takes it from here, and `register_head` files the class under it;
      - `papers`: the papers it implements (card tags and citations);
      - `plain_export_limit`: one phrase: why it has no plain export (`exact_plain_export` False;
        also its refusal's reason), or which of its options have none (the serving table);
      - `exact_plain_export`: with its default options `export_plain` writes a stock LM head
        whose logits are the head's (a single softmax of an affine map of `h`);
      - `exact_conversion`: with its default options, converted (`from_backbone`) from a tied LM
        head (GPT-2's), it reproduces the original's logits;
      - `single_softmax`: its next-token distribution is one softmax of scores of the final hidden
        state alone (no middle layers, no mixture), at one softmax's cost: a head that the `mtp`
        head's future-token predictors can share; such a head implements `word_scorer`;
      - `training_losses()`: the training losses it offers (its options' `training_loss` choices;
        `("exact",)` for heads whose training loss is always the exact fused one);
      - `benchmark_options`: `{variant: options}` the benchmark runs it with ("" the plain one;
        a variant is named `head_type-variant`);
      - `contract_options`: the options the shared contract tests build it with, on the tests'
        tiny backbones (hidden 32, 2 layers, vocabulary 99); `contract_variants`: further forms
        (`{suffix: options over contract_options}`) that the sharded-training tests train too.

    Capabilities the model reads:
      - `layer_indices`: indices into the backbone's `hidden_states` the head needs besides
        the final hidden state (0 = embedding output); empty for most heads.
      - `returns_log_probs`: `logits` holds normalised log-probabilities (mixtures).
      - `reads_embeddings`: its scores read the backbone's input embedding matrix `E` (a
        `TiedToEmbeddings` head then shows `E` as its `weight`, which keeps them in one FSDP group).
      - `unlabelled_training_loss`: for a head whose training terms beside the next-token loss need
        the labels (`mtp`'s future-token losses, `doc`'s regulariser), what a training forward
        without labels leaves out, as a clause the model's warning quotes; None for the others.
    A head's dropout is an `nn.Dropout`'s rate `p` (its option sets it), so that what switches
    every dropout off (TRL's `disable_dropout_in_model`, the sharded tests) reaches it.
    Optional training hooks (no-ops here), which training loops call for any head:
      - `set_word_counts(counts)`: training-set word frequencies, once before training;
      - `updates_periodically`: the head learns something besides its parameters by
        `periodic_update(reduce)` at an interval (lightrnn's word-code table); a loop calls
        `begin_periodic_updates()` once (the head then collects statistics in its training
        forwards), then `periodic_update(reduce)` every so many steps, which returns metrics.
        `reduce(tensor)` sums a statistic over processes (`accelerator.reduce`); the head
        calls it on every process, so the loop calls `periodic_update` on every process.
    Subclasses implement `forward(inputs, labels) -> HeadOutput` and `init_from_lm_head`;
    `resize_vocab` has a generic default (used by `model.resize_token_embeddings`).
    """

    head_type: ClassVar[str]
    Options: ClassVar[type[HeadOptions]] = HeadOptions
    returns_log_probs: ClassVar[bool] = False
    updates_periodically: ClassVar[bool] = False
    papers: ClassVar[tuple[Paper, ...]] = ()
    exact_plain_export: ClassVar[bool] = False
    plain_export_limit: ClassVar[str] = ""
    exact_conversion: ClassVar[bool] = False
    single_softmax: ClassVar[bool] = False
    benchmark_options: ClassVar[dict[str, dict]] = {"": {}}
    contract_options: ClassVar[dict] = {}
    contract_variants: ClassVar[dict[str, dict]] = {}

    def __init_subclass__(cls, **kwargs):
        """A class naming its `head_type` hands it to its `Options` (which no other head may use)."""
        super().__init_subclass__(**kwargs)
        if "head_type" in vars(cls):
            owner = vars(cls.Options).get("head_type")
            if owner not in (None, cls.head_type):
                raise TypeError(f"{cls.__name__}.Options ({cls.Options.__name__}) belongs to head '{owner}': "
                                f"give head '{cls.head_type}' an options class of its own (a subclass).")
            cls.Options.head_type = cls.head_type

    @classmethod
    def training_losses(cls) -> tuple[str, ...]:
        """The `training_loss` choices its options declare; `("exact",)` when it has no such option."""
        spec = next((f.metadata["spec"] for f in dataclasses.fields(cls.Options) if f.name == "training_loss"), None)
        return spec.choices if spec is not None else ("exact",)

    def __init__(self, options: HeadOptions, dims: HeadDims):
        """`options`: resolved for `dims` (`options.resolve(dims)`; a model's come from
        `OutHeadsConfig.resolved_head_options`). Sub-classes read `self.options`."""
        super().__init__()
        resolved_for = options.resolved_for  # by value: remote code loads the config's and the model's modules apart
        if resolved_for is None or dataclasses.astuple(resolved_for) != dataclasses.astuple(dims):
            raise ValueError(f"Head '{self.head_type}' got options not resolved for its sizes {dims}: pass "
                             f"options.resolve(dims) (a model's come from OutHeadsConfig.resolved_head_options).")
        self.options = options
        self.dims = dims
        self.register_load_state_dict_post_hook(_check_loaded_state)

    @property
    def layer_indices(self) -> tuple[int, ...]:
        return ()

    @property
    def reads_embeddings(self) -> bool:
        """Whether the scores read `E` (see the class docstring). Default: no."""
        return False

    @property
    def unlabelled_training_loss(self) -> str | None:
        """What a training forward without labels leaves untrained (see the class docstring). Default: None."""
        return None

    def bind_input_embeddings(self, module: nn.Module) -> None:
        """The model hands over the embedding module whose weight is `E` (at build and after a
        resize), for `TiedToEmbeddings.weight`. Kept outside `_modules`: `E` stays the backbone's
        parameter (no second state-dict key, no parameter in two modules)."""
        self.__dict__["_input_embeddings"] = module

    def reset_parameters(self) -> None:
        """Fresh initialisation (from scratch). Must use `transformers.initialization`."""
        raise NotImplementedError

    def init_from_lm_head(self, weight: torch.Tensor, bias: torch.Tensor, embeddings: torch.Tensor) -> bool:
        """Initialise from a pretrained LM head `weight h + bias`; return True when the
        head then reproduces the original scores exactly, False when it cannot."""
        raise NotImplementedError

    def forward(self, inputs: HeadInputs, labels: torch.Tensor | None = None) -> HeadOutput:
        raise NotImplementedError

    def conversion_labels(self, weight: torch.Tensor, embeddings: torch.Tensor) -> torch.Tensor:
        """The matrix `init_from_lm_head` fits the head to as its `embeddings` (a conversion from
        an LM head `weight`): E, or a head's own labels started from `weight`."""
        return embeddings

    def forward_flops(self, num_positions: int) -> int:
        """Floating-point operations (2 per multiply-add) of the head's matrix products in one
        training forward over `num_positions` scored positions, context-independent work (a
        label encoder) counted once. A backward costs about twice this (`hf_outheads/training/flops.py`)."""
        raise NotImplementedError

    def loss_path(self, device: torch.device) -> str:
        """What computes this head's training loss on `device` (recorded beside measured runs).
        Default: the package's fused loss (`losses.mixture_nll_sum`)."""
        return own_path(device)

    def generation_scope(self):
        """Context manager the model enters around each `generate` call, in which nothing the
        head reads changes (single-softmax heads reuse their label matrix). Default: nothing."""
        return contextlib.nullcontext()

    def candidate_generator(self, model, generation_config, logits_processor, prompt_embeds=None):
        """The `transformers` `CandidateGenerator` that drafts tokens for `generate(..., use_mtp=True)`
        (assisted decoding, `model._get_candidate_generator`); `prompt_embeds`: the prompt positions
        given only as embeddings (`generate(inputs_embeds=...)`), or None. Default: a ValueError, for
        heads that predict no future tokens."""
        raise ValueError(f"Head '{self.head_type}' predicts only the next token, so it has nothing to draft with: "
                         "use_mtp=True needs a model with future-token predictors (head_type='mtp').")

    def check_state(self) -> None:
        """Raise a ValueError if loaded values break the head's invariants; called after
        `load_state_dict` and `from_pretrained`. Default: nothing to check."""
        return None

    def logit_transform(self) -> tuple[float, float]:
        """`(scale, cap)`: the head's scores are `cap tanh(scale s / cap)` of the affine scores `s`
        (cap 0: `scale s`; `logit_transforms`), as `equivalent_lm_head` / `plain_lm_head` give `s`.
        Default: `(1.0, 0.0)`, for heads without these options."""
        return 1.0, 0.0

    def plain_lm_head(self, embeddings: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """`(weight, bias)` when this head is a plain `weight h + b` softmax (`tied`, `linear`),
        so that `from_backbone` can convert a model with this head to another head; else None."""
        return None

    def equivalent_lm_head(self, embeddings: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """`(weight, bias)` of the plain LM head `weight h + bias` (bias None: no bias) that
        computes this head's inference-time (eval mode) scores, for `export_plain`; a ValueError
        saying why when there is none. Default: none, for heads whose distribution is not one
        softmax of an affine map of `h` (the mixtures, `lightrnn`, `sigsoftmax`: `plain_export_limit`)."""
        reason = self.plain_export_limit or "its distribution is not one softmax of an affine map of `h`"
        raise ValueError(f"Head '{self.head_type}' has no plain equivalent: {reason}, so no stock transformers LM head "
                         "computes it. Serve the model with hf_outheads (or trust_remote_code=True).")

    def word_scorer(self, embeddings: torch.Tensor, rows: torch.Tensor | None = None):
        """A function of final hidden states giving the inference-time scores (`forward`'s logits)
        of the words `rows` (ids; None: every word), its context-independent part (the rows of the
        label matrix) computed once, here. `single_softmax` heads implement it; the `mtp` head drafts
        with it (over its `draft_vocab_size` shortlist). Default: a ValueError naming the head."""
        raise ValueError(f"Head '{self.head_type}' scores no words apart: its distribution is not one softmax "
                         "of scores of the final hidden state (`single_softmax`).")

    def set_word_counts(self, counts: torch.Tensor) -> None:
        """Training-set frequency of every word (`|V|` counts). Training pipelines call it once
        before training, for any head; heads that use word frequencies (a unigram sampling
        proposal, a frequency-sorted code table) override it. Default: unused."""
        return None

    def begin_periodic_updates(self) -> None:
        """Start collecting what `periodic_update` needs (see the class docstring). Default: nothing."""
        return None

    def periodic_update(self, reduce: Callable[[torch.Tensor], torch.Tensor] | None = None) -> dict:
        """Update from the statistics collected since the last call, reset them, return metrics;
        `reduce` sums a tensor over processes (None: one process). Default: nothing, `{}`."""
        return {}

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


# head type -> head class: every head this process imported (`head_catalog` imports the package's), in
# import order; filled by `register_head` only
HEAD_CLASSES: dict[str, type[OutputHead]] = {}


def register_head(cls: type[OutputHead]) -> type[OutputHead]:
    """Class decorator: file a head class under its `head_type` in `HEAD_CLASSES`, and name it as its
    options' head (`HeadOptions.head_class`: an options object names the class a model builds from
    it). A head type that another class holds already is a ValueError (as peft's
    `register_peft_method`): a second head of the same name never replaces the first silently."""
    head_type = vars(cls).get("head_type") if isinstance(cls, type) and issubclass(cls, OutputHead) else None
    if not isinstance(head_type, str):
        raise TypeError(f"register_head takes an OutputHead subclass that states its own head_type; got {cls!r}.")
    taken = HEAD_CLASSES.setdefault(head_type, cls)
    if taken is not cls:
        raise ValueError(f"Head type {head_type!r} is taken by {taken.__module__}.{taken.__qualname__}: give "
                         f"{cls.__module__}.{cls.__qualname__} another head_type.")
    cls.Options.head_class = cls
    return cls


def get_head_class(head_type: str) -> type[OutputHead]:
    try:
        return HEAD_CLASSES[head_type]
    except KeyError:
        raise ValueError(f"Unknown head type {head_type!r}. Valid head types: {sorted(HEAD_CLASSES)}.") from None


class OutputBias:
    """Mixin of the heads whose scores end in a per-word bias `b` (the `output_bias` option): the
    parameter `bias` (`|V|`, zeros from scratch; None with `output_bias=False`) and its conversion."""

    def build_output_bias(self) -> None:
        bias = nn.Parameter(torch.empty(self.dims.vocab_size)) if self.options.output_bias else None
        self.register_parameter("bias", bias)  # `b`, per word; None with output_bias=False

    def reset_bias(self) -> None:
        if self.bias is not None:
            init.zeros_(self.bias)

    def copy_bias(self, bias: torch.Tensor) -> bool:
        """Set `b` from a converted LM head's bias; False when this head has no bias and `bias`
        is not constant (then the converted head cannot give the original's distribution)."""
        if self.bias is not None:
            with torch.no_grad():
                self.bias.copy_(bias)
            return True
        return bool((bias == bias.reshape(-1)[:1]).all())

    def bias_or_zeros(self, like: torch.Tensor) -> torch.Tensor:
        """`b` (detached), or zeros of `like`'s dtype for a head without a bias."""
        if self.bias is None:
            return torch.zeros(self.dims.vocab_size, dtype=like.dtype, device=like.device)
        return self.bias.detach()


class TiedToEmbeddings:
    """Mixin of the heads that score with the backbone's input embedding matrix `E` (tied,
    bilinear, joint, drill; lightrnn with `tied=True`): `weight` is that `E`, as a tied LM head's
    weight is the input embedding's. Libraries recognise a tied output layer by
    `model.get_output_embeddings().weight is model.get_input_embeddings().weight`; accelerate's
    FSDP2 preparation (`fsdp2_prepare_model`) then shards the input embedding and the output
    layer as one group that stays gathered from the embedding lookup to the head, which a head
    reading `E` needs (in separate groups the head would meet a sharded `E`). `weight` is no
    attribute (AttributeError) while no embedding is bound or when the head's `reads_embeddings`
    is False (lightrnn's untied codes; `labels="own"`, `SoftmaxHead.reads_embeddings`)."""

    @property
    def weight(self) -> torch.Tensor:
        module = self.__dict__.get("_input_embeddings")
        if module is None or not self.reads_embeddings:
            raise AttributeError(f"Head '{self.head_type}' reads no input embedding matrix: it has no 'weight'.")
        return module.weight


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


def training_mode(training_loss: str, training: bool, device: torch.device, return_logits: bool | None = None) -> str:
    """The loss a forward on `device` computes: "full" outside training; `training_loss` in
    training, "auto" resolved to "chunked" on a CUDA device (the fused loss, no logits) and "full"
    elsewhere; the model argument `return_logits` overrides it (True: "full"; False: "chunked",
    or "sampled" kept)."""
    mode = training_loss if training else "full"
    if mode == "auto":
        mode = "chunked" if device.type == "cuda" else "full"
    if return_logits is not None:
        mode = "full" if return_logits else ("sampled" if mode == "sampled" else "chunked")
    return mode


def nll_sum_from_logits(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Summed cross-entropy in fp32 over non-ignored labels (works on scores and on log-probs)."""
    return F.cross_entropy(
        logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=IGNORE_INDEX, reduction="sum"
    )


def word_rows(weight: torch.Tensor, bias: torch.Tensor | None, rows: torch.Tensor | None):
    """`(weight[rows], bias[rows])` of a per-word matrix and bias (None: no bias; `rows` None: every word)."""
    if rows is None:
        return weight, bias
    return weight[rows], None if bias is None else bias[rows]
