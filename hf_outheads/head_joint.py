"""`joint`: structure-aware output layer over a joint input-output embedding (Pappas,
Miculicich & Henderson 2018, "Beyond Weight Tying", Eq. 12-15).

Scores `g_out(E) . g_in(h) + b` with `g_out(E) = act(E U + b_u)` (`|V| x d_j`, Eq. 12) and
`g_in(h) = act(V h + b_v)` (`d_j`, Eq. 13). `form` selects the paper's Table 3 ablations:
"both" (Eq. 15, default), "output" (Eq. 7a, `act(E U + b_u) h`, needs `d_j == d_h`),
"context" (Eq. 7b, `E act(V h + b_v)`, needs `d_j == d`), "bilinear" (Eq. 6, `E V h`,
needs `d_j == d`, no activation). With identity activation and identity projections it is
`tied` (Eq. 18).

`joint_dim` defaults to the size the form needs, `d_h` for "both": the paper's
same-capacity setting (Table 3, Eq. 15 with `d_j = d = d_h = 512`, best on En-De), whose
scoring matmul costs what `tied`'s does. The paper's best De-En model uses 2048 (4x d);
the label encoder costs `2 |V| d d_j` and scoring `2 N d_j |V|` FLOPs per forward.

Departures from paper / reference code (idiap/joint-embedding-nmt):
- The ablation forms keep the bias of the projection they use (Eq. 12/13); Eq. 6/7 omit it.
- No sampled softmax here (paper 3.2); evaluation and generation use the full vocabulary
  in the paper too.
- Defaults chosen by measurement on a from-scratch transformer LM:
  `activation="identity"` and `init="identity"` (projections at a (semi-)identity, so the
  head starts exactly as `tied`). The paper's tanh with the reference init (every parameter
  uniform(-0.1, 0.1), `init="uniform"`) trained to a much worse model, and tanh started at the
  identity stalled near the unigram distribution: tanh bounds `g_in(h)`, which replaces the
  backbone's unbounded final-norm state. Output bias zero.
  `map_scale`: U and V are stored as `base I + map_scale A` (`scaled_map.py`), so they learn
  `map_scale` times slower than the backbone under Adam (unset: 0.01 from scratch, 1 converted,
  `JointOptions`; measured: at the backbone's rate from scratch the maps made the head worse than `tied`).
  The paper's plain parameters are `map_scale: 1`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from .head_options import HeadDims, choice, integer
from .scaled_map import MapOptions, ScaledMap
from .head_interface import Paper, TiedToEmbeddings, register_head
from .softmax import SoftmaxHead

ACTIVATIONS = {"tanh": torch.tanh, "sigmoid": torch.sigmoid, "relu": torch.relu, "identity": lambda x: x}
SLOPE_AT_ZERO = {"tanh": 1.0, "sigmoid": 0.25, "relu": 1.0, "identity": 1.0}
FORMS = ("both", "output", "context", "bilinear")


@dataclass
class JointOptions(MapOptions):
    """`joint_dim` left unset is filled in by `resolve`, so a saved config states it; `output_bias`
    false drops `b_v` too (whose score `g_out(e_w) . b_v` is a per-word bias)."""

    scratch_defaults: ClassVar[dict] = {"map_scale": 0.01}  # measured: at 1 the maps made the head worse than `tied`
    conversion_defaults: ClassVar[dict] = {"map_scale": 1.0}  # measured: then lower perplexity than `tied`

    joint_dim: int | None = integer(None, minimum=1, optional=True, help=(
        "d_j, the joint space's width; unset: d_h for the forms 'both' and 'output', d for 'context' and "
        "'bilinear' (the paper: 2048)"))
    activation: str = choice("identity", ACTIVATIONS, help="activation of both projections ('tanh': the paper)")
    form: str = choice("both", FORMS, help=(
        "which sides are projected (Table 3): 'both' (Eq. 14-15), 'output' (labels only), 'context' (the "
        "hidden state only), 'bilinear' (no activation, E W h)"))

    def complete(self, dims: HeadDims) -> None:
        super().complete(dims)
        d, d_h = ("d", dims.embed_dim), ("d_h", dims.hidden_dim)
        needed = {"output": d_h, "context": d, "bilinear": d}  # forms with one projection fix d_j
        if self.joint_dim is None:
            self.joint_dim = needed.get(self.form, d_h)[1]
        if self.form in needed and self.joint_dim != needed[self.form][1]:
            name, size = needed[self.form]
            self.fail(f"with form '{self.form}' there is no projection on one side, so joint_dim must equal "
                      f"{name}={size}, got {self.joint_dim}. Omit joint_dim or use form 'both'.")


@register_head
class JointHead(TiedToEmbeddings, SoftmaxHead):
    head_type = "joint"
    keeps_label_matrix = True
    Options = JointOptions
    papers = (Paper("Beyond Weight Tying: Learning Joint Input-Output Embeddings for Neural Machine Translation",
                    "https://aclanthology.org/W18-6308", """\
@inproceedings{pappas-etal-2018-beyond,
  title = {Beyond Weight Tying: Learning Joint Input-Output Embeddings for Neural Machine Translation},
  author = {Pappas, Nikolaos and Miculicich, Lesly and Henderson, James},
  booktitle = {Proceedings of the Third Conference on Machine Translation: Research Papers},
  year = {2018},
  pages = {73--83}
}""", arxiv="1808.10681"),)
    exact_plain_export = exact_conversion = True  # with identity activation (the default)
    plain_export_limit = ("not with a tanh, sigmoid or relu context (`form` `both` or `context`): `act(V h + b_v)` "
                          "is not affine in `h`")
    benchmark_options = {"": {}}  # joint_dim = d_h
    contract_options = {"joint_dim": 16}

    def __init__(self, options: JointOptions, dims: HeadDims):
        super().__init__(options, dims)
        options = self.options  # resolved: joint_dim is set
        d_j, form = options.joint_dim, options.form

        def scaled_map(in_dim: int, bias: bool = True) -> ScaledMap:
            return options.scaled_map(in_dim, d_j, bias, gain=1.0 / SLOPE_AT_ZERO[options.activation])

        self.out_proj = scaled_map(dims.embed_dim) if form in ("both", "output") else None  # U, b_u
        has_b_v = form != "bilinear" and options.output_bias
        self.in_proj = scaled_map(dims.hidden_dim, bias=has_b_v) if form != "output" else None  # V, b_v
        self.act = ACTIVATIONS[options.activation]
        self.in_act_name = options.activation if form in ("both", "context") else "identity"
        self.in_act = ACTIVATIONS[self.in_act_name]

    def reset_parameters(self) -> None:
        """"identity": each projection starts at a (semi-)identity over the activation's slope at
        0, biases 0, so the head starts near `tied` (exactly with identity activation and
        `joint_dim >= d`); "uniform": the reference code, every parameter uniform(-0.1, 0.1)."""
        for proj in (self.out_proj, self.in_proj):
            if proj is not None:
                proj.reset()
        self.reset_bias()
        self.reset_label_source()

    def label_matrix(self, embeddings: torch.Tensor) -> torch.Tensor:
        return self.act(self.out_proj(embeddings)) if self.out_proj is not None else embeddings

    def context(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.in_act(self.in_proj(hidden)) if self.in_proj is not None else hidden

    def label_flops(self) -> int:
        return 2 * self.dims.vocab_size * self.dims.embed_dim * self.options.joint_dim if self.out_proj is not None else 0

    def context_flops(self) -> int:
        return 2 * self.dims.hidden_dim * self.options.joint_dim if self.in_proj is not None else 0

    def score_width(self) -> int:
        return self.options.joint_dim

    def context_map(self):
        """`(V, b_v)`; not affine (a ValueError) when `g_in` has a tanh / sigmoid / relu."""
        if self.in_proj is None:
            return None, None
        if self.in_act_name != "identity":
            raise ValueError(
                f"Head 'joint': its context g_in(h) = {self.in_act_name}(V h + b_v) is not an affine map of h, so "
                "no plain LM head computes its scores. Train with activation 'identity' (the default), or form "
                "'output' or 'bilinear', to export exactly; or serve it with hf_outheads.")
        bias = None if self.in_proj.bias is None else self.in_proj.bias.detach()
        return self.in_proj.effective_weight().detach(), bias

    def init_from_lm_head(self, weight, bias, embeddings) -> bool:
        """Start from `E M h + b`, `M = I` for a tied original, else the least-squares fit of
        `E M ~= W` (as `bilinear`; approximate). "both" factors `M = U V` (SVD, rank
        `min(d, d_h, d_j)`); the other forms put `M` in their one projection.

        Exact (returns True) for a tied original with identity activation (and `d_j >= d`
        for "both"), form "bilinear", or relu with form "output" (`b_u = -min(E U)` keeps relu
        linear: logits shift by `b_u . h`, same distribution). Otherwise approximate:
        tanh and sigmoid are bounded, so `g_out . g_in` cannot equal `E h`; they are started in
        their linear regime `act(x) ~ act(0) + slope * x`, with the per-word offset
        `g_out(e_w) . act(b_v)` removed through `b`. For "both", U and V are rotated by a
        fixed random orthogonal matrix (spreads outlier dimensions) and scaled by `a, c` with
        `a c slope^2 = 1`, balanced for a hidden state of unit RMS per coordinate; the error
        is cubic in the pre-activations and shrinks as d_j grows. Relu shifts its inputs
        onto the linear side: exact on the output side, on the input side for
        `V h > -3 ||V_j||` (three standard deviations of a unit-RMS h).
        """
        form, act_name, d_j = self.options.form, self.options.activation, self.options.joint_dim
        linear = act_name == "identity" or form == "bilinear"
        slope = 1.0 if linear else SLOPE_AT_ZERO[act_name]
        with torch.no_grad():
            E, W = embeddings.double(), weight.double()  # float64: float32 LAPACK varies in its last bits between runs
            tied = weight.shape == embeddings.shape and torch.equal(weight, embeddings)
            M = torch.eye(E.shape[1], dtype=E.dtype, device=E.device) if tied else torch.linalg.lstsq(E, W).solution
            U = V = None
            if form == "both":
                U, V = self._factor(M, tied, rotate=not linear)
                r_e = (E @ U).pow(2).mean().sqrt().clamp(min=1e-12)
                r_h = (V.pow(2).sum() / d_j).sqrt().clamp(min=1e-12)
                a = 1.0 if linear else (r_h / r_e).sqrt().item() / slope
                U, V = a * U, V / (a * slope * slope)
            elif form == "output":
                U = M / slope
            else:
                V = M / slope
            g_out = E
            if U is not None:
                b_u = torch.zeros(d_j, dtype=E.dtype, device=E.device)
                if act_name == "relu":
                    b_u = (-(E @ U).min(dim=0).values).clamp(min=0)
                self.out_proj.set_effective_weight(U.T)
                self.out_proj.bias.copy_(b_u)
                g_out = self.act(E @ U + b_u)
            offset = torch.zeros(1, dtype=E.dtype, device=E.device)
            if V is not None:
                self.in_proj.set_effective_weight(V)
                b_v = torch.zeros_like(V[:, 0])
                if self.in_proj.bias is not None:
                    b_v = 3.0 * V.norm(dim=1) if act_name == "relu" else b_v
                    self.in_proj.bias.copy_(b_v)
                offset = g_out @ self.in_act(b_v)  # per-word score of g_in's resting value
        exact_bias = self.copy_bias(bias.float() - offset)
        exact_form = linear or (act_name == "relu" and form == "output")
        return bool(exact_bias and tied and exact_form and (form != "both" or d_j >= E.shape[1]))

    def _factor(self, M: torch.Tensor, tied: bool, rotate: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """`U` (`d x d_j`), `V` (`d_j x d_h`) with `U V = M` up to rank `d_j`."""
        d_j = self.options.joint_dim
        if tied:
            left = right = torch.eye(M.shape[0], dtype=M.dtype, device=M.device)
        else:
            A, S, Bh = torch.linalg.svd(M, full_matrices=False)
            left, right = A * S.sqrt(), S.sqrt()[:, None] * Bh
        r = min(left.shape[1], d_j)
        if rotate:
            g = torch.Generator().manual_seed(0)  # deterministic conversion
            basis = torch.linalg.qr(torch.randn(d_j, d_j, generator=g, dtype=torch.float64)).Q[:r]
        else:
            basis = torch.eye(r, d_j, dtype=torch.float64)
        basis = basis.to(dtype=M.dtype, device=M.device)
        return left[:, :r] @ basis, basis.T @ right[:r]
