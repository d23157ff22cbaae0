"""`mtp`: multi-token prediction. A single-softmax output head predicts the next token as usual;
`num_future` predictors each add one more future token (t+2, t+3, ...), scored by the same
(shared) head. Trained with the weighted future-token losses; at generation they draft tokens
that the next-token head verifies (self-speculative decoding, `generate(..., use_mtp=True)`).

Two published forms (`form`):
  - "sequential" (DeepSeek-V3, arXiv 2412.19437, Sec. 2.2, Eq. 21-25; the default): depth k reads
    the previous depth's state at position t (depth 0: the backbone's final state) and the
    embedding of token t+k, each RMS-normalised, concatenated, projected, then one transformer
    block; its state, RMS-normalised, goes to the shared head and predicts token t+k+1;
  - "independent" (Gloeckle et al. 2024, arXiv 2404.19737, Sec. 2): depth k is one transformer
    block on the backbone's final state (the shared trunk), predicting token t+k+1 from it alone.
Training loss: `L_main + loss_weight / D * sum_k L_k` with D = `num_future` and `L_k` the NLL of
depth k (DeepSeek-V3 Eq. 25: lambda 0.3 for its first 10T tokens, then 0.1; Gloeckle et al.'s plain
sum of all heads' losses is `loss_weight = D`). `L_main` is the model's `nll_loss`; each `L_k` is
depth k's summed NLL over the next-token loss's count (`extra_nll_sum`: the model divides it by the
same count, `num_items_in_batch` when given), so that it sums over micro-batches and processes as the
next-token loss does, in `hf_outheads/training/train.py` and in `Trainer` alike (depth k has k fewer labels per
sequence, so this is its mean times `(T - 1 - k) / (T - 1)` on full sequences of T tokens).
`aux_terms` holds each depth's mean NLL (`mtp_nll_k`), which the training loop logs apart.
The future terms are computed whenever labels are given; outside training (`eval()`) the model leaves
them out of `loss`, which is then the next-token NLL (`exp(eval_loss)` the perplexity), and `aux_terms`
still names each depth's loss (the package's evaluation scores the logits without labels, so it pays
nothing for them).
The future losses run through the shared head's memory-lean loss (`return_logits=False`: the
chunked loss, or the sampled one when the shared head trains with it), in bf16 as it does.

Options (defaults):
  - `head` ("tied"), `head_options` ({}): the shared output head and its options: any head whose
    class is `single_softmax` (`linear`, `tied`, `bilinear`, `joint`, `drill`, `sigsoftmax`). Not the
    mixtures: each draft and each future loss would cost K softmaxes, eating the speed that drafting
    buys, and no stock LM head computes them (`export_plain`); `doc` also needs middle-layer states
    that future predictors do not have.
  - `num_future` (1, DeepSeek-V3's depth D; Gloeckle et al.'s n is D + 1), `form` ("sequential"),
    `loss_weight` (0.3);
  - `num_attention_heads` (None: `d_h // 64`, at least 1), `intermediate_size` (None: `8 d_h / 3`
    rounded up to a multiple of 64) of each predictor's block (`future_blocks.FutureBlock`).
  - `draft_vocab_size` (None: every word): drafts score only this many words, the training set's
    most frequent (`set_word_counts`; kept in the `draft_tokens` buffer, saved with the model), so a
    draft's head product costs that share of a full one: the frequency-ranked draft vocabulary of
    FR-Spec (Zhao et al. 2025, arXiv 2502.14856) and EAGLE-3 (Li et al. 2025, arXiv 2503.01840).
    The next-token head still verifies over every word: greedy output is unchanged, and sampling
    still follows its distribution (a draft's probability is 0 outside the shortlist).
Departures: the block is a Llama-layout block built from the head's sizes, not a layer of the
backbone's own family (see `future_blocks`); the future predictors read the tokens ahead from the
model's input ids (from the labels when the model got embeddings: positions whose token is an
ignored label then train nothing); their block attends over every earlier position, padding too.

Conversion (`from_backbone`): the shared head is converted as that head alone (exact for `tied`
and `linear`); the predictors start fresh. `export_plain` writes the shared head's plain form:
the next-token model as a stock transformers model, without the predictors.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from .future_blocks import FuturePredictor
from .head_interface import HEAD_CLASSES, IGNORE_INDEX, HeadInputs, HeadOutput, OutputHead, Paper, register_head
from .head_options import HeadDims, HeadOptions, choice, integer, mapping, number, text

FORMS = ("sequential", "independent")
GLOECKLE_2024 = Paper("Better & Faster Large Language Models via Multi-token Prediction",
                      "https://arxiv.org/abs/2404.19737", """\
@inproceedings{gloeckle2024better,
  title = {Better \\& Faster Large Language Models via Multi-token Prediction},
  author = {Gloeckle, Fabian and Youbi Idrissi, Badr and Rozi{\\`e}re, Baptiste and Lopez-Paz, David and Synnaeve, Gabriel},
  booktitle = {Proceedings of the 41st International Conference on Machine Learning},
  year = {2024}
}""", arxiv="2404.19737")
DEEPSEEK_V3 = Paper("DeepSeek-V3 Technical Report", "https://arxiv.org/abs/2412.19437", """\
@misc{deepseekai2024deepseekv3,
  title = {{DeepSeek-V3} Technical Report},
  author = {{DeepSeek-AI}},
  year = {2024},
  eprint = {2412.19437},
  archivePrefix = {arXiv}
}""", arxiv="2412.19437")


def shared_head_class(head: str) -> type[OutputHead] | None:
    """The registered class of `head` (`HEAD_CLASSES`) when it can be shared (`single_softmax`), else None."""
    cls = HEAD_CLASSES.get(head)
    return cls if cls is not None and cls.single_softmax else None


def shifted(tensor: torch.Tensor, steps: int, fill: int) -> torch.Tensor:
    """`tensor[..., t + steps]` at position t, `fill` past the end."""
    return F.pad(tensor[..., steps:], (0, min(steps, tensor.shape[-1])), value=fill)


@dataclass
class MTPOptions(HeadOptions):
    head_type: ClassVar[str] = "mtp"

    head: str = text("tied", help="the shared output head: a single-softmax head type")
    head_options: dict | HeadOptions = mapping(dict, help=(
        "the shared head's options (resolved: its options object)"))
    num_future: int = integer(1, minimum=1, help="D, the future tokens predicted (t+2 ... t+D+1)")
    form: str = choice("sequential", FORMS, help=(
        "'sequential' (DeepSeek-V3: each depth reads the previous one and the token ahead) or 'independent' "
        "(Gloeckle et al.: each depth reads the backbone's state alone)"))
    loss_weight: float = number(0.3, low=0.0, help="lambda of L_main + lambda / D sum_k L_k (DeepSeek-V3 Eq. 25)")
    num_attention_heads: int | None = integer(None, minimum=1, optional=True, help=(
        "attention heads of each predictor's block; unset: d_h / 64, at least 1"))
    intermediate_size: int | None = integer(None, minimum=1, optional=True, help=(
        "width of each predictor's SwiGLU; unset: 8 d_h / 3 rounded up to a multiple of 64"))
    draft_vocab_size: int | None = integer(None, minimum=1, optional=True, help=(
        "drafts score only this many words, the training set's most frequent; unset: every word"))

    @classmethod
    def _with_shared(cls, options, method: str) -> dict:
        options = dict(options or {})
        shared = shared_head_class(options.get("head") or "tied")
        if shared is not None and (options.get("head_options") is None or isinstance(options["head_options"], dict)):
            options["head_options"] = getattr(shared.Options, method)(options.get("head_options"))
        return options

    def for_conversion(self) -> "MTPOptions":
        """A copy with the conversion defaults, the shared head's among its options (e.g. `drill`'s dropout 0)."""
        converted = super().for_conversion()
        shared = shared_head_class(converted.head or "tied")
        if shared is not None and (converted.head_options is None or isinstance(converted.head_options, dict)):
            converted.head_options = {**shared.Options.conversion_defaults, **(converted.head_options or {})}
        return converted

    @classmethod
    def for_saved(cls, options):
        return super().for_saved(cls._with_shared(options, "for_saved"))

    def complete(self, dims: HeadDims) -> None:
        shared = shared_head_class(self.head)
        if shared is None:
            choices = [head for head, cls in HEAD_CLASSES.items() if cls.single_softmax]
            self.fail(f"option 'head'={self.head!r} is not one of {choices}: the future predictors share one "
                      "single-softmax head (a mixture would cost K softmaxes per drafted token).")
        given = self.head_options  # a dict, or (resolving resolved options again) the shared head's object
        try:
            self.head_options = (given if isinstance(given, shared.Options) else shared.Options.from_dict(given)).resolve(dims)
        except ValueError as error:
            self.fail(f"option 'head_options' of the shared head: {error}")
        heads = self.num_attention_heads or max(1, dims.hidden_dim // 64)
        if dims.hidden_dim % heads:
            self.fail(f"option 'num_attention_heads'={heads} does not divide the hidden width d_h={dims.hidden_dim}.")
        self.num_attention_heads = heads
        if self.draft_vocab_size is not None and self.draft_vocab_size >= dims.vocab_size:
            self.fail(f"option 'draft_vocab_size'={self.draft_vocab_size} is not below the vocabulary's size "
                      f"{dims.vocab_size}: give fewer words, or None to draft over every word.")
        self.intermediate_size = self.intermediate_size or -(-8 * dims.hidden_dim // 3 // 64) * 64


@register_head
class MTPHead(OutputHead):
    """The shared head (`shared`, any `single_softmax` head) and one `FuturePredictor` per future token
    (`predictors`). Capabilities and the interface's hooks are the shared head's."""

    head_type = "mtp"
    Options = MTPOptions
    papers = (GLOECKLE_2024, DEEPSEEK_V3)
    exact_plain_export = exact_conversion = True  # with the default shared head, `tied`
    benchmark_options = {"": {"num_future": 2}}
    contract_options = {"head": "tied", "num_future": 2, "num_attention_heads": 2, "draft_vocab_size": 50}
    contract_variants = {"independent": {"form": "independent"}}

    def __init__(self, options: MTPOptions, dims: HeadDims):
        super().__init__(options, dims)
        shared = shared_head_class(options.head)
        self.shared = shared(options.head_options, dims)  # resolved with these options (`MTPOptions.complete`)
        reads_tokens = options.form == "sequential"
        self.predictors = nn.ModuleList(
            FuturePredictor(dims.hidden_dim, dims.embed_dim, options.num_attention_heads, options.intermediate_size,
                            reads_tokens) for _ in range(options.num_future))
        self.draft_counts = None  # the last `generate(use_mtp=True)` call's `DraftCounts`
        if options.draft_vocab_size is not None:  # the lowest ids until `set_word_counts` ranks the words
            self.register_buffer("draft_tokens", torch.arange(options.draft_vocab_size))
        else:
            self.draft_tokens = None

    @property
    def weight(self) -> torch.Tensor:
        """The shared head's `weight` (E for a head that reads it: `TiedToEmbeddings`)."""
        return self.shared.weight

    @property
    def reads_embeddings(self) -> bool:
        return getattr(self.shared, "reads_embeddings", False)

    @property
    def unlabelled_training_loss(self) -> str:
        return "its future-token predictors get no loss and do not train (their losses need the labels)"

    def bind_input_embeddings(self, module: nn.Module) -> None:
        super().bind_input_embeddings(module)
        self.shared.bind_input_embeddings(module)

    def reset_parameters(self) -> None:
        self.shared.reset_parameters()
        for predictor in self.predictors:
            predictor.reset_parameters()

    def init_from_lm_head(self, weight, bias, embeddings) -> bool:
        """The shared head from the LM head (exact where that head's conversion is); predictors fresh."""
        return self.shared.init_from_lm_head(weight, bias, embeddings)

    def conversion_labels(self, weight, embeddings):
        return self.shared.conversion_labels(weight, embeddings)

    def generation_scope(self):
        return self.shared.generation_scope()

    def check_state(self) -> None:
        self.shared.check_state()
        tokens = self.draft_tokens
        if tokens is not None and (tokens.min() < 0 or tokens.max() >= self.dims.vocab_size
                                   or tokens.unique().numel() != tokens.numel()):
            raise ValueError(f"Head 'mtp': the loaded 'draft_tokens' are not {tokens.numel()} distinct word ids below "
                             f"{self.dims.vocab_size}: the checkpoint does not belong to this model's vocabulary.")

    def plain_lm_head(self, embeddings):
        return self.shared.plain_lm_head(embeddings)

    def logit_transform(self) -> tuple[float, float]:
        return self.shared.logit_transform()

    def equivalent_lm_head(self, embeddings):
        """The next-token model's plain LM head (the shared head's): the export drops the predictors."""
        return self.shared.equivalent_lm_head(embeddings)

    def set_word_counts(self, counts) -> None:
        """The shared head's counts; the draft vocabulary becomes the most frequent words (ties: lower id)."""
        self.shared.set_word_counts(counts)
        if self.draft_tokens is not None:
            ranked = torch.sort(torch.as_tensor(counts).reshape(-1), descending=True, stable=True).indices
            self.draft_tokens.copy_(ranked[: self.draft_tokens.numel()].sort().values)

    def resize_vocab(self, new_size: int) -> None:
        """The shared head resized; the draft vocabulary drops ids past a smaller vocabulary by returning to
        the lowest ids (call `set_word_counts` again to rank the words)."""
        if self.draft_tokens is not None:
            if new_size <= self.draft_tokens.numel():
                raise ValueError(f"Head 'mtp': a vocabulary of {new_size} words is not above option "
                                 f"'draft_vocab_size'={self.draft_tokens.numel()}: lower it or draft over every word.")
            if self.draft_tokens.max() >= new_size:
                self.draft_tokens.copy_(torch.arange(self.draft_tokens.numel()))
        self.shared.resize_vocab(new_size)
        self.dims = dataclasses.replace(self.dims, vocab_size=new_size)

    def forward_flops(self, num_positions: int) -> int:
        """The shared head once per depth (1 + D), and every predictor's matrix products (attention
        scores not counted: they depend on the sequence length, see `FutureBlock.flops`)."""
        depths = 1 + len(self.predictors)
        return depths * self.shared.forward_flops(num_positions) + sum(
            p.flops(num_positions, 0) for p in self.predictors)

    def future_states(self, hidden: torch.Tensor, embeddings: torch.Tensor, tokens: torch.Tensor | None):
        """`(k, state)` of depth k = 1..D over every position: the block outputs, before `norm`.
        `tokens[..., t]` is token t + 1 (the sequential form's depth k reads `tokens[..., t + k - 1]`)."""
        state = hidden
        for k, predictor in enumerate(self.predictors, start=1):
            if predictor.merge is None:
                yield k, predictor(hidden)
                continue
            state = predictor(state, F.embedding(shifted(tokens, k - 1, 0).clamp_min(0), embeddings))
            yield k, state

    def forward(self, inputs: HeadInputs, labels: torch.Tensor | None = None) -> HeadOutput:
        out = self.shared(inputs, labels)
        if labels is None:
            return out
        # tokens[t] = token t + 1: the input ids shifted, or the labels (ignored ones unknown)
        tokens = labels if inputs.token_ids is None else shifted(inputs.token_ids, 1, IGNORE_INDEX)
        sums, counts, extras = [], [], []
        for k, state in self.future_states(inputs.hidden, inputs.embeddings, tokens):
            future = shifted(labels, k, IGNORE_INDEX)  # token t + k + 1
            if self.predictors[k - 1].merge is not None:  # an unknown input token trains nothing
                future = future.masked_fill(shifted(tokens, k - 1, IGNORE_INDEX) == IGNORE_INDEX, IGNORE_INDEX)
            scored = HeadInputs(self.predictors[k - 1].norm(state), inputs.embeddings, return_logits=False)
            future_out = self.shared(scored, future)  # its extra term (the shared head's z-loss) weighs as its NLL
            extras.append(future_out.extra_nll_sum)
            sums.append(future_out.nll_sum)
            counts.append((future != IGNORE_INDEX).sum().clamp_min(1))
        named = {f"mtp_nll_{k}": (total / count).detach() for k, (total, count) in enumerate(zip(sums, counts), start=1)}
        sums = [total if extra is None else total + extra for total, extra in zip(sums, extras)]
        weighted = self.options.loss_weight / len(sums) * torch.stack(sums).sum()
        if out.extra_nll_sum is not None:  # the next-token head's own term (its z-loss)
            weighted = weighted + out.extra_nll_sum
        return HeadOutput(logits=out.logits, nll_sum=out.nll_sum, extra_nll_sum=weighted,
                          aux_terms={**(out.aux_terms or {}), **named})

    def candidate_generator(self, model, generation_config, logits_processor, prompt_embeds=None):
        """Drafts from the future predictors (`mtp_drafting.FutureDrafts`)."""
        from .mtp_drafting import FutureDrafts

        return FutureDrafts(model, self, generation_config, logits_processor, prompt_embeds)
