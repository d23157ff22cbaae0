"""Single-softmax heads: `p(y|h) = softmax(label_matrix(E) . context(h) + b)` (DRILL paper Eq. 1-3
and 7; joint-embedding paper Eq. 14). Subclasses (`linear`, `tied`, `bilinear`, `joint`,
`drill`) define the context-independent `label_matrix` and the per-position `context`.

What they share, for speed and memory:
  - the label matrix is computed once per forward pass; in `generate` (the model enters
    `head.generation_scope()`) a computed one (drill, joint: `keeps_label_matrix`) is kept
    across calls while the tensors it is computed from hold the same values (checked once per
    call against a copy of them, which costs the memory of E and the head's parameters);
  - `training_loss="chunked"` (or the model argument `return_logits=False`): the exact loss
    from a fused linear cross-entropy whose gradient is computed in its forward pass, never
    holding `N x |V|` logits, by the fastest kernel installed (`loss_kernels`; `loss_kernel`
    forces one); no logits returned. The default, "auto", is "chunked" on a CUDA device and
    "full" elsewhere;
  - `training_loss="sampled"`: the joint-embedding paper's sampled softmax in training
    (`sampled_nll_sum` below), full softmax for evaluation and generation;
  - the scores' scale and soft cap (`logit_transforms`: the backbone family's by default, as
    Gemma 2/3's or Cohere's LM head) in every path, and a z-loss in training (the scores'
    log-normaliser from the same pass: the fused kernels' `lse`), counted in `loss`, not `nll_loss`.

The sampled softmax over a batch-shared candidate set (joint input-output embedding paper,
Pappas et al. 2018, Sec. 3.2): the candidates are every distinct target of the batch plus
negatives sampled from the rest of the vocabulary until they make up `fraction` of it; only
their scores are computed and updated. Departure from the reference code (uniform negatives, no
correction): each candidate's score is corrected by `-log q_c`, `q_c` its probability of being in
the set (1 for the batch's targets), so that the candidates' `sum exp(s_c) / q_c` is an
importance-sampling estimate of the full partition function; with a unigram proposal this is the
log-Q correction of Jean et al. (2015). Accidental hits cannot occur: negatives are drawn from the
words that are not targets of the batch. The candidate set's size depends on the batch's targets,
so this loss reads them back from the device (the other losses read nothing).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn
from transformers import initialization as init

from .head_interface import (IGNORE_INDEX, HeadInputs, HeadOutput, OutputBias, OutputHead, nll_sum_from_logits,
                             training_mode, word_count_vector, word_rows)
from .losses import linear_cross_entropy
from .head_options import HeadDims, choice, flag, number
from .logit_transforms import LogitTransformOptions, logit_transform, scaled_affine, softcap, z_loss_sum
from .loss_kernels import PEER_KERNELS, fastest_kernel, needed_features, unsupported

TRAINING_LOSSES = ("auto", "full", "chunked", "sampled")
LOSS_KERNELS = ("auto", "own", *PEER_KERNELS)
LABEL_SOURCES = ("embeddings", "own")
PROPOSALS = ("uniform", "unigram")


def sample_candidates(
    targets: torch.Tensor, vocab_size: int, fraction: float, log_q: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(sorted distinct targets, sampled negatives, log inclusion probability of each negative).

    `log_q`: log proposal over the vocabulary (None = uniform). Uniform negatives are drawn
    without replacement; unigram ones with replacement (then de-duplicated), a word drawn
    `k` times having inclusion probability `1 - (1 - q_w) ** k`.
    """
    positives = torch.unique(targets)
    wanted = max(int(fraction * vocab_size) - positives.numel(), 0)
    pool = torch.ones(vocab_size, dtype=torch.bool, device=targets.device)
    pool[positives] = False
    pool_ids = pool.nonzero().squeeze(1)
    wanted = min(wanted, pool_ids.numel())
    if log_q is None:
        negatives = pool_ids[torch.randperm(pool_ids.numel(), device=targets.device)[:wanted]]
        log_incl = torch.full((negatives.numel(),), wanted / max(pool_ids.numel(), 1), device=targets.device).log()
    else:
        q = log_q[pool_ids].float().softmax(0)  # renormalised over the pool
        draws = torch.multinomial(q, wanted, replacement=True) if wanted else q.new_zeros(0, dtype=torch.long)
        picked = torch.unique(draws)
        negatives = pool_ids[picked]
        log_incl = torch.log(-torch.expm1(wanted * torch.log1p(-q[picked].clamp(max=1 - 1e-7))))
    return positives, negatives, log_incl.float()


def sampled_nll_sum(
    context: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    labels: torch.Tensor,
    fraction: float,
    log_q: torch.Tensor | None = None,
    cap: float = 0.0,
) -> torch.Tensor:
    """Summed NLL of the non-ignored labels under the sampled softmax (fp32), of the candidates'
    scores soft-capped at `cap` (`logit_transforms.softcap`; 0: none) before the correction."""
    labels = labels.reshape(-1)
    keep = labels != IGNORE_INDEX
    context, labels = context.reshape(-1, context.shape[-1])[keep], labels[keep]
    if labels.numel() == 0:
        return context.sum() * 0.0
    positives, negatives, log_incl = sample_candidates(labels, weight.shape[0], fraction, log_q)
    candidates = torch.cat([positives, negatives])
    scores = F.linear(context.float(), weight[candidates].float(), None if bias is None else bias[candidates].float())
    scores = softcap(scores, cap)
    correction = torch.cat([log_incl.new_zeros(positives.shape), log_incl])  # targets are in with certainty
    return F.cross_entropy(scores - correction, torch.searchsorted(positives, labels), reduction="sum")


@dataclass
class SoftmaxOptions(LogitTransformOptions):
    """The single-softmax heads' options: how they train (the loss, the kernel computing it, the
    sampled softmax's candidate set), the output bias, the z-loss, and the scores' scale and soft
    cap (`LogitTransformOptions`)."""

    training_loss: str = choice("auto", TRAINING_LOSSES, help=(
        "'full': logits and cross-entropy, as transformers; 'chunked': the exact loss without N x |V| logits; "
        "'sampled': the joint-embedding paper's sampled softmax, in training only; 'auto': 'chunked' on a CUDA "
        "device, 'full' elsewhere"))
    loss_kernel: str = choice("auto", LOSS_KERNELS, help=(
        "what computes the 'chunked' loss: 'auto' (the fastest kernel installed for the device and |V|), 'own' "
        "(the package's), or a peer's, which must be installed: 'liger', 'cce', 'torch'"))
    sampled_fraction: float = number(0.25, 0.0, 1.0, open_low=True, help=(
        "share of the vocabulary in the sampled softmax's candidate set (the paper: 0.25)"))
    sampled_proposal: str = choice("uniform", PROPOSALS, help=(
        "the sampled softmax's proposal: 'uniform' (the paper) or 'unigram' (with the log-Q correction; needs "
        "`set_word_counts`)"))
    output_bias: bool = flag(True, help=(
        "learn a per-word output bias b (the papers' form); false: none, so that the head exports exactly as a "
        "stock LM head without one (GPT-2, Llama, T5, ...)"))
    z_loss: float = number(0.0, 0.0, help=(
        "coefficient c of the z-loss c log(Z)^2 per scored token in training (PaLM: 1e-4); 0: none; not with the "
        "sampled loss"))

    def __post_init__(self):
        super().__post_init__()
        self.check_losses()  # what was given, when parsed: a run's options are refused before its data is read

    def complete(self, dims: HeadDims) -> None:
        self.check_losses()  # again with the backbone's soft cap filled in

    def check_losses(self) -> None:
        """The training loss, its kernel and the z-loss fit together."""
        if self.z_loss and self.training_loss == "sampled":
            self.fail("option 'z_loss' needs the full log-normaliser log Z, which the sampled loss (training_loss="
                      "'sampled') never computes: use another training_loss, or z_loss 0.")
        why = self.loss_kernel in PEER_KERNELS and unsupported(self.loss_kernel, needed_features(
            self.logit_softcap, self.z_loss))
        if why:
            self.fail(f"option 'loss_kernel'={self.loss_kernel!r}: {why}; use 'auto' (the fastest kernel that does) "
                      "or 'own'.")


@dataclass
class EncodedLabelsOptions(SoftmaxOptions):
    """Options of the heads that encode a label matrix (`bilinear`, `joint`, `drill`)."""

    labels: str = choice("embeddings", LABEL_SOURCES, help=(
        "the label matrix encoded: 'embeddings' (the backbone's input embeddings E, as the papers) or 'own' (a "
        "|V| x d matrix of the head's own: the original head's when converted), so that the head's structure comes "
        "on top of an untied output matrix"))


def _same_values(kept: tuple, tensors: tuple) -> bool:
    return len(kept) == len(tensors) and all(
        a.shape == b.shape and a.dtype == b.dtype and a.device == b.device and torch.equal(a, b)
        for a, b in zip(kept, tensors))


class SoftmaxHead(OutputBias, OutputHead):
    """A single softmax over factorised scores; see the module docstring."""

    # True where `label_matrix` computes a new matrix (drill, joint): worth keeping across
    # `generate` calls. Elsewhere it returns a stored tensor, and keeping copies would only cost.
    keeps_label_matrix: ClassVar[bool] = False
    single_softmax = True

    Options = SoftmaxOptions

    def __init__(self, options, dims):
        super().__init__(options, dims)
        self.build_output_bias()
        self._label_cache: tuple | None = None  # (copies of the inputs, their key, label matrix)
        self._generating = self._checked = False
        self._log_unigram: torch.Tensor | None = None
        own = getattr(self.options, "labels", "embeddings") == "own"
        self.own_labels = nn.Parameter(torch.empty(dims.vocab_size, dims.embed_dim)) if own else None

    def reset_label_source(self) -> None:
        """Own labels (`labels="own"`): N(0, 0.02^2), as an untied head's matrix. Heads with
        `EncodedLabelsOptions` call it last in `reset_parameters` (the other parameters draw
        the same values either way)."""
        if self.own_labels is not None:
            init.normal_(self.own_labels, 0.0, 0.02)

    @property
    def reads_embeddings(self) -> bool:
        """Whether the scores read E (`TiedToEmbeddings`): not with own labels."""
        return self.own_labels is None

    def label_source(self, embeddings: torch.Tensor) -> torch.Tensor:
        """What `label_matrix` encodes: the own labels, or E."""
        return embeddings if self.own_labels is None else self.own_labels

    @torch.no_grad()
    def conversion_labels(self, weight: torch.Tensor, embeddings: torch.Tensor) -> torch.Tensor:
        """Own labels start as the original head's matrix (E where its shape differs), and the
        head's `init_from_lm_head` then fits its encoder to them."""
        if self.own_labels is None:
            return embeddings
        self.own_labels.copy_(weight if weight.shape == self.own_labels.shape else embeddings)
        return self.own_labels.detach()

    def label_matrix(self, embeddings: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def context(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden

    def label_flops(self) -> int:
        """FLOPs of `label_matrix` (once per forward); 0 for a stored matrix."""
        return 0

    def context_flops(self) -> int:
        """FLOPs of `context` per position; 0 for the identity."""
        return 0

    def score_width(self) -> int:
        """Width of the label matrix (and of the context)."""
        return self.dims.embed_dim

    def forward_flops(self, num_positions: int) -> int:
        """Label matrix once, then `num_positions` contexts and `|V|` scores each (the full
        softmax; a `sampled` training loss scores fewer words, not counted here)."""
        per_position = self.context_flops() + 2 * self.score_width() * self.dims.vocab_size
        return self.label_flops() + num_positions * per_position

    def context_map(self) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """`(A, c)` with `context(h) = A h + c` (None: the identity, no offset); a ValueError
        saying why when the context is not affine in `h`. Default: the identity."""
        return None, None

    @torch.no_grad()
    def equivalent_lm_head(self, embeddings: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The head at inference (eval mode) as one plain LM head: scores
        `L (A h + c) + b = (L A) h + (L c + b)`, with `L = label_matrix(E)` and `A, c` from
        `context_map()`; the product is taken in float64. Returns `(weight, bias)`, bias None
        when the scores have no per-word constant."""
        was_training = self.training
        self.eval()
        try:
            label = self.label_matrix(self.label_source(embeddings)).detach()
        finally:
            self.train(was_training)
        A, c = self.context_map()
        weight = label if A is None else (label.double() @ A.double()).to(label.dtype)
        bias = None if self.bias is None else self.bias.detach()
        if c is not None:
            offset = (label.double() @ c.double()).to(label.dtype)
            bias = offset if bias is None else bias + offset
        return weight, bias

    def current_label_matrix(self, embeddings: torch.Tensor) -> torch.Tensor:
        """`label_matrix(E)`; inside `generation_scope()` (no autograd, eval mode) kept across
        steps and calls. The first use in a scope compares the tensors it was computed from (E
        and the head's parameters) with copies taken then, value by value, since `param.data`
        writes (e.g. a PEFT merge) change no tensor version; later steps of the scope check only
        identity, storage and version. Outside a scope computed on every call."""
        if not (self.keeps_label_matrix and self._generating) or self.training or torch.is_grad_enabled():
            return self.label_matrix(embeddings)
        tensors = (embeddings, *self.parameters())
        key = tuple((id(t), t.data_ptr(), t._version, t.dtype, t.device) for t in tensors)
        cached = self._label_cache
        if cached is None or (key != cached[1] or not self._checked) and not _same_values(cached[0], tensors):
            matrix = self.label_matrix(embeddings)
            cached = (tuple(t.detach().clone() for t in tensors), key, matrix)
        self._label_cache, self._checked = (cached[0], key, cached[2]), True
        return cached[2]

    @contextmanager
    def generation_scope(self):
        """Within this scope (one `generate` call) the label matrix is computed at most once."""
        outer, self._generating, self._checked = (self._generating, self._checked), True, False
        try:
            yield
        finally:
            self._generating, self._checked = outer

    def train(self, mode: bool = True):
        self._label_cache = None  # training changes the weights: drop the kept matrix and copies
        return super().train(mode)

    def word_scorer(self, embeddings: torch.Tensor, rows: torch.Tensor | None = None):
        """`h -> L[rows] (A h + c) + b[rows]`, scaled and capped: `forward`'s logits at the columns `rows`
        (None: all), the label matrix taken once (`current_label_matrix`, kept within `generation_scope()`)."""
        weight, bias = word_rows(self.current_label_matrix(self.label_source(embeddings)), self.bias, rows)
        scale, cap = logit_transform(self.options)

        def scores(hidden):
            context, scaled_bias = scaled_affine(self.context(hidden), bias, scale)
            return softcap(F.linear(context, weight, scaled_bias), cap)
        return scores

    def logit_transform(self) -> tuple[float, float]:
        return logit_transform(self.options)

    def loss_path(self, device: torch.device) -> str:
        """`training_loss` resolved for a training forward on `device`, and for the fused loss the
        kernel (`loss_kernel`, "auto": `loss_kernels.fastest_kernel`)."""
        mode = training_mode(self.options.training_loss, True, device)
        if mode != "chunked":
            return mode
        kernel, needs = self.options.loss_kernel, needed_features(self.options.logit_softcap, self.options.z_loss)
        kernel = fastest_kernel(device.type, self.dims.vocab_size, needs) if kernel == "auto" else kernel
        return super().loss_path(device) if kernel == "own" else f"chunked: {kernel}"

    def set_word_counts(self, counts: torch.Tensor) -> None:
        """Unigram proposal for `sampled_proposal="unigram"` (add-one smoothed)."""
        self._log_unigram = torch.log(word_count_vector(self, counts).float() + 1.0)

    def _sampled_nll(self, context, weight, bias, labels) -> torch.Tensor:
        log_q = None
        if self.options.sampled_proposal == "unigram":
            if self._log_unigram is None:
                raise ValueError(
                    f"Head '{self.head_type}' samples from a unigram proposal: call "
                    "model.head.set_word_counts(counts) with the training-set word counts first."
                )
            log_q = self._log_unigram.to(context.device)
        return sampled_nll_sum(context, weight, bias, labels, self.options.sampled_fraction, log_q,
                               self.options.logit_softcap)

    def forward(self, inputs: HeadInputs, labels: torch.Tensor | None = None) -> HeadOutput:
        """Logits (scores `softcap(scale (L c + b))`), or in training with the fused or sampled loss
        only the loss; with the z-loss (training only) its sum is `extra_nll_sum`, its mean `aux_terms`'
        `z_loss`. The fused kernels compute the gradient of NLL and z-loss together and return the
        z-loss without one, so there `nll_sum` carries the sum's gradient: a caller weights the two alike."""
        weight = self.current_label_matrix(self.label_source(inputs.embeddings))
        scale, cap = logit_transform(self.options)
        context, bias = scaled_affine(self.context(inputs.hidden), self.bias, scale)
        mode = training_mode(self.options.training_loss, self.training, inputs.hidden.device, inputs.return_logits)
        z_coefficient = self.options.z_loss if self.training and labels is not None else 0.0
        if labels is None or mode == "full":
            logits = F.linear(context, weight)  # no view (F.linear with a bias returns one for 3-d input: FSDP2
            logits = softcap(logits if bias is None else logits.add_(bias), cap)  # warns), one |V|-wide pass more
            if labels is None:
                return HeadOutput(logits=logits)
            z = z_loss_sum(logits, labels, z_coefficient) if z_coefficient else None
            return self._with_z_loss(HeadOutput(logits=logits, nll_sum=nll_sum_from_logits(logits, labels)), z, labels)
        if mode == "sampled":
            return HeadOutput(nll_sum=self._sampled_nll(context, weight, bias, labels))
        total, z = linear_cross_entropy(context, weight, labels, bias, reduction="sum", impl=self.options.loss_kernel,
                                        softcap=cap, z_loss=z_coefficient, return_z_loss=True)
        return self._with_z_loss(HeadOutput(nll_sum=total if z is None else total - z), z, labels)

    @staticmethod
    def _with_z_loss(out: HeadOutput, z: torch.Tensor | None, labels: torch.Tensor) -> HeadOutput:
        if z is not None:
            out.extra_nll_sum = z
            out.aux_terms = {"z_loss": (z / (labels != IGNORE_INDEX).sum().clamp_min(1)).detach()}
        return out
