"""`drill`: deep residual output layer (Pappas & Henderson 2019, "Deep Residual Output
Layers for Neural Language Generation", Eq. 7-12).

Scores `E^(k) h + b` with a label encoder of depth k over the input embeddings E:
`E^(0) = E`, `E^(i) = f_i(E^(i-1)) + E` (Eq. 10, residual to E), `f_i(X) = act(X U_i + b_i)`
(Eq. 9, `U_i` is `d x d`), and dropout between layers (3.2.4, Eq. 12). `g_in` is the
identity, so `d == d_h` is required, and depth 0 is exactly `tied`.

Defaults: depth 2 (the paper's Transformer setting, Sec. 4.2), relu with standard dropout
0.1 (the paper's WikiText-2 form, Sec. 4.1, at a transformer's dropout rate), residual to E
only. Departure, chosen by measurement: the paper's Transformer setting
(sigmoid, no dropout) trained to a worse model than the tied head on a from-scratch
transformer LM, relu with standard dropout 0.1 to a better one. The paper's PTB setting is
depth 4, sigmoid, locked dropout 0.6. `dropout` left unset is 0 when the head is converted
from a trained one (`from_backbone`): measured better than 0.1 in both fine-tuning
comparisons (LM perplexity and seq2seq BLEU; the figures are in the repository's results).

Departures from paper / reference code (idiap/drill):
- `dropout_position="input"` (default) drops each layer's input, `act(drop(X) U + b) + E`,
  as the reference code does (the code behind the paper's numbers); `"output"` drops the
  layer's output as written in Eq. 12.
- `residual_previous` adds `E^(i-1)` from layer 2 on, as the reference code does; Eq. 10
  read literally would add E twice at layer 1 (`E^(0) = E`).
- Init: `U_i` uniform(-0.1, 0.1) and output bias zero (paper); `b_i` uniform(+-1/sqrt(d)),
  PyTorch's Linear default, which the reference code keeps.
- `E^(k)` is computed once per forward (never per position), and kept across `generate` calls
  while E and the weights hold the same values (`softmax.py`).
- A layer with dropout on its input (standard or locked) is one autograd node
  (`_ResidualLayer`): activation and residual add in place, backward keeps the dropped input
  and one-byte masks (depth 2, relu: 3 saved `|V| x d` matrices instead of 3.5), and a
  locked mask scales W's columns instead of E's. Its standard mask takes 16 random bits per
  element (`keep_mask`), so the rate is `p` rounded to a multiple of 2^-16.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import nn
import torch.nn.functional as F
from transformers import initialization as init

from .head_options import HeadDims, choice, flag, integer, number, require_tied_width
from .head_interface import Paper, TiedToEmbeddings, register_head
from .softmax import EncodedLabelsOptions, SoftmaxHead

ACTIVATIONS = {"sigmoid": torch.sigmoid, "relu": torch.relu, "tanh": torch.tanh}
SLOPE_AT_ZERO = {"sigmoid": 0.25, "relu": 1.0, "tanh": 1.0}  # act(x) ~ act(0) + slope * x
DROPOUT_KINDS = ("locked", "standard")
DROPOUT_POSITIONS = ("input", "output")


@dataclass
class DrillOptions(EncodedLabelsOptions):
    """`dropout` left unset: 0.1 from scratch, 0 when converted (measured)."""

    depth: int = integer(2, minimum=0, help="k, the label encoder's layers (0: the `tied` head)")
    activation: str = choice("relu", ACTIVATIONS, help="activation of each encoder layer")
    dropout: float | None = number(None, 0.0, 1.0, open_high=True, optional=True, help=(
        "dropout rate in the encoder's layers; unset: the head's default from scratch, 0 when converted"))
    dropout_kind: str = choice("standard", DROPOUT_KINDS, help=(
        "'standard': a fresh mask over |V| x d; 'locked' (variational): one (1, d) mask shared by every vocabulary "
        "row, per layer and forward"))
    dropout_position: str = choice("input", DROPOUT_POSITIONS, help=(
        "where a layer drops: its 'input' (the reference code) or its 'output' (Eq. 12)"))
    residual_previous: bool = flag(False, help="also add the previous layer's output E^(i-1) (Eq. 10)")
    scratch_defaults: ClassVar[dict] = {"dropout": 0.1}  # measured (the repository's ablations)
    conversion_defaults: ClassVar[dict] = {"dropout": 0.0}  # measured (the repository's ablations)

    def complete(self, dims: HeadDims) -> None:
        super().complete(dims)
        require_tied_width(self.head_type, dims, "scores E^(k) h with a residual to E in every layer",
                           "'joint' (any d_j) or 'bilinear'")


def keep_mask(shape: torch.Size, p: float, device: torch.device | None = None) -> tuple[torch.Tensor, float]:
    """A bool keep mask with drop probability `p` rounded to a multiple of 2^-16, and that
    probability. Each element compares one 16-bit lane of a uniform 64-bit draw with a
    threshold: a quarter of the generator calls of `torch.rand(shape) >= p`, which is what a
    `|V| x d` mask costs on a CPU (about half of it, measured), not the comparison."""
    drops = min(round(p * 65536), 65535)
    count = math.prod(shape)
    bits = torch.randint(-(2**63), 2**63 - 1, ((count + 3) // 4,), dtype=torch.int64, device=device)
    lanes = bits.view(torch.int16)[:count].view(shape)
    return lanes >= drops - 32768, drops / 65536


# In place on the layer's output, and the derivative from the activated value: relu keeps a
# one-byte mask, as autograd's own relu would keep the float output.
IN_PLACE = {"relu": (torch.Tensor.relu_, lambda y: y > 0),
            "sigmoid": (torch.Tensor.sigmoid_, lambda y: y * (1 - y)),
            "tanh": (torch.Tensor.tanh_, lambda y: 1 - y * y)}


class _ResidualLayer(torch.autograd.Function):
    """`act(drop(x) W^T + b) + E` (Eq. 9, 10; dropout on the layer's input, standard inverted
    dropout at rate p) as one autograd node. The activation and the residual add work in
    place on the layer's output, and backward saves the dropped input, a one-byte keep mask
    and the activation's derivative (one byte for relu): two fresh `|V| x d` matrices per layer
    in forward and two in backward instead of four and five. On a CPU each fresh one costs
    its page faults (allocations that large are mmap'd), more than the arithmetic on it.
    When x is E itself (the first layer), its two gradients are summed in place."""

    @staticmethod
    def forward(ctx, x, weight, bias, embeddings, p, activation):
        keep, scale, dropped = None, 1.0, x
        if p > 0.0:
            keep, p = keep_mask(x.shape, p, x.device)
            dropped, scale = torch.where(keep, x, 0.0), 1.0 / (1.0 - p)  # scale goes on the d x d weight
        out = F.linear(dropped, weight * scale, bias)
        act_, derivative = IN_PLACE[activation]
        act_(out)
        slope = derivative(out) if any(ctx.needs_input_grad) else None
        if out.dtype != embeddings.dtype:  # autocast: add E at the wider precision, as autograd would
            out = out.to(torch.promote_types(out.dtype, embeddings.dtype))
        out.add_(embeddings)
        ctx.save_for_backward(dropped, weight, keep, slope)
        ctx.scale, ctx.x_is_embeddings = scale, x is embeddings
        return out

    @staticmethod
    def backward(ctx, grad):
        dropped, weight, keep, slope = ctx.saved_tensors
        residual_grad = grad
        grad = torch.where(slope, grad, 0.0) if slope.dtype == torch.bool else grad * slope
        grad = grad.to(weight.dtype)  # bf16 under autocast; the saved tensors keep their dtype
        grad_x = grad_weight = grad_bias = grad_embeddings = None
        if ctx.needs_input_grad[0]:
            grad_x = grad @ (weight * ctx.scale)
            if keep is not None:
                torch.where(keep, grad_x, grad_x.new_zeros(()), out=grad_x)
            grad_x = grad_x.to(dropped.dtype)
        if ctx.needs_input_grad[1]:
            grad_weight = (grad.flatten(0, -2).T @ dropped.to(grad.dtype).flatten(0, -2)).mul_(ctx.scale)
        if ctx.needs_input_grad[2]:
            grad_bias = grad.flatten(0, -2).sum(0)
        if ctx.needs_input_grad[3]:
            grad_embeddings = residual_grad
            if ctx.x_is_embeddings and grad_x is not None:
                grad_x, grad_embeddings = grad_x.add_(residual_grad), None
        return grad_x, grad_weight, grad_bias, grad_embeddings, None, None


class LabelDropout(nn.Dropout):
    """Dropout on a label matrix `X` (`|V| x d`), DRILL Sec. 3.2.4: "standard" draws a new
    elementwise mask; "locked" (variational, Gal & Ghahramani 2016) draws one `(1, d)` mask
    per call, shared by every vocabulary row. Inverted scaling, identity in eval mode. An
    `nn.Dropout` (no parameters): what switches every dropout off (`module.p = 0` on each
    `nn.Dropout`, as TRL's `disable_dropout_in_model`) switches this one off too."""

    def __init__(self, p: float, kind: str):
        super().__init__(p)
        self.kind = kind

    def active(self) -> bool:
        return self.training and self.p > 0.0

    def column_mask(self, x: torch.Tensor) -> torch.Tensor:
        return x.new_empty(1, x.shape[-1]).bernoulli_(1.0 - self.p) / (1.0 - self.p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.active():
            return x
        if self.kind == "standard":
            return F.dropout(x, self.p, training=True)
        return x * self.column_mask(x)

    def residual_layer(self, x: torch.Tensor, layer: nn.Linear, activation: str, embeddings: torch.Tensor) -> torch.Tensor:
        """`act(layer(self(x))) + embeddings` as one node (`_ResidualLayer`). A locked mask
        scales W's columns instead: `(x diag(m)) W^T = x (W diag(m))^T`, no `|V| x d` mask."""
        weight, p = layer.weight, 0.0
        if self.active():
            if self.kind == "locked":
                weight = weight * self.column_mask(x)
            else:
                p = self.p
        return _ResidualLayer.apply(x, weight, layer.bias, embeddings, p, activation)

    def extra_repr(self) -> str:
        return f"p={self.p}, kind={self.kind}"


@register_head
class DrillHead(TiedToEmbeddings, SoftmaxHead):
    head_type = "drill"
    keeps_label_matrix = True
    Options = DrillOptions
    papers = (Paper("Deep Residual Output Layers for Neural Language Generation",
                    "https://proceedings.mlr.press/v97/pappas19a.html", """\
@inproceedings{pappas2019deep,
  title = {Deep Residual Output Layers for Neural Language Generation},
  author = {Pappas, Nikolaos and Henderson, James},
  booktitle = {Proceedings of the 36th International Conference on Machine Learning},
  series = {Proceedings of Machine Learning Research},
  volume = {97},
  pages = {5000--5011},
  year = {2019}
}""", arxiv="1905.05513"),)
    exact_plain_export = exact_conversion = True
    benchmark_options = {"": {"depth": 2}}
    contract_options = {"depth": 2}

    def __init__(self, options: DrillOptions, dims: HeadDims):
        super().__init__(options, dims)
        options, d = self.options, dims.embed_dim
        self.layers = nn.ModuleList(nn.Linear(d, d) for _ in range(options.depth))  # U_i, b_i
        self.dropout = LabelDropout(options.dropout, options.dropout_kind)
        self.act = ACTIVATIONS[options.activation]

    def reset_parameters(self) -> None:
        bound = 1.0 / math.sqrt(self.dims.embed_dim)
        for layer in self.layers:
            init.uniform_(layer.weight, -0.1, 0.1)  # paper and reference code
            init.uniform_(layer.bias, -bound, bound)  # reference: nn.Linear's default
        self.reset_bias()
        self.reset_label_source()

    def encode_layer(self, i: int, previous: torch.Tensor, embeddings: torch.Tensor) -> torch.Tensor:
        """`E^(i)` from `E^(i-1)` (Eq. 9, 10, 12); i counts from 0."""
        layer, activation = self.layers[i], self.options.activation
        if self.options.dropout_position == "input":
            out = self.dropout.residual_layer(previous, layer, activation, embeddings)
        else:
            out = self.dropout(self.act(layer(previous))) + embeddings
        if self.options.residual_previous and i > 0:
            out = out + previous
        return out

    def label_matrix(self, embeddings: torch.Tensor) -> torch.Tensor:
        out = embeddings
        for i in range(len(self.layers)):
            out = self.encode_layer(i, out, embeddings)
        return out

    def label_flops(self) -> int:
        return len(self.layers) * 2 * self.dims.vocab_size * self.dims.embed_dim**2

    def init_from_lm_head(self, weight, bias, embeddings) -> bool:
        """Fit each layer so that `E^(i) ~= E` and `E^(k) ~= W` (the original head), up to a
        constant added to every row, which shifts all scores of a position equally and
        leaves the next-token distribution unchanged. Layer by layer, `act(X U + b)` is
        fitted to its target `T` through `act(x) ~ act(0) + slope * x`: `U = lstsq(X, T) / slope`,
        and `b_i` centres `X U` per column (relu: shifts it to >= 1/sqrt(d), so every unit is
        active: at 0 relu's gradient is 0, and a converted tied head would never move), a row
        constant in `f_i`.

        Exact (returns True) for a tied original (`W == E`) without `residual_previous`:
        the target is 0, so `U_i = 0` and `f_i = act(b_i)`: 0 for tanh (the logits are the
        original's), `1/sqrt(d)` for relu and `1/2` for sigmoid (every logit of a position
        moves by `sum(h)/sqrt(d)` or `sum(h)/2`: same distribution, different logits). With
        `residual_previous`, layers >= 2 must cancel `E^(i-1)`: exact for relu
        (`U = -I`, `b = max(E^(i-1)) + 1/sqrt(d)` keeps relu linear), approximate for tanh/sigmoid
        (`tanh(-X) ~ -X`, `sigmoid(-4X) ~ 1/2 - X`: good while embedding entries are small,
        measured max |log p| error 5e-4 (tanh) / 2e-3 (sigmoid) on tiny GPT-2 with N(0, 0.02)
        embeddings, useless for T5's N(0, 1) ones).
        An untied original is approximated by the least-squares fit of `W - E` on `E^(k-1)`
        (a label row is a function of its embedding only; exact with relu when `W - E` lies
        in that column span). Returns whether the achieved `E^(k)` equals `W` up to a row
        constant (relative 1e-5; exactly, when the head soft-caps its scores: a constant then
        changes the distribution, so relu and sigmoid layers are approximate).
        """
        exact_bias = self.copy_bias(bias)
        with torch.no_grad():  # fitted in float64: float32 LAPACK results differ in their last bits from run to run
            target_final, E = weight.double(), embeddings.double()
            if target_final.shape != E.shape:
                return False
            slope, previous = SLOPE_AT_ZERO[self.options.activation], E
            for i, layer in enumerate(self.layers):
                wanted = target_final if i == len(self.layers) - 1 else E
                target = wanted - E - (previous if self.options.residual_previous and i > 0 else 0)
                if torch.count_nonzero(target) == 0:
                    U = torch.zeros_like(layer.weight, dtype=torch.float64)
                else:
                    U = torch.linalg.lstsq(previous, target).solution / slope
                pre = previous @ U  # b_i centres it on act's linear part (a row constant in f_i)
                if self.options.activation == "relu":  # every unit on relu's linear side, with gradient
                    b = -pre.min(dim=0).values.clamp(max=0) + 1.0 / math.sqrt(self.dims.embed_dim)
                else:
                    b = -pre.mean(dim=0)
                layer.weight.copy_(U.T)
                layer.bias.copy_(b)
                branch = self.act(pre + b) + E
                previous = branch + previous if self.options.residual_previous and i > 0 else branch
            error = previous - target_final
            if not self.logit_transform()[1]:  # a row constant moves a position's scores alike: the same softmax,
                error = error - error.mean(dim=0, keepdim=True)  # but not the same soft-capped one
            return exact_bias and bool(error.abs().max() <= 1e-5 * max(target_final.abs().max().item(), 1.0))
