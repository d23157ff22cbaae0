"""`bilinear`: `s(h) = E W_l h + b`, `W_l` is `d x d_h` (DRILL paper, Eq. 3; Gulordava et al. 2018).

Computed as `E (W_l h)`: `N d d_h` per call instead of `|V| d d_h` for `E W_l`.

Option `init` (from scratch): "identity" (default) starts `W_l` at `I` (`tied`'s scores;
a `d x d_h` semi-identity when d != d_h); "uniform" is the DRILL
reference init, uniform(-0.1, 0.1), which starts from a random projection of `h` (departure:
measured worse on transformer backbones).
Option `map_scale`: `W_l` is stored as `I + map_scale * A` (`scaled_map.py`), so it learns
`map_scale` times slower than the backbone under Adam; unset, 0.1 from scratch and 1 when converted
(`BilinearOptions`, measured; departure from scratch: the paper's plain `W_l` is `map_scale: 1` with `init: uniform`).
"""

from __future__ import annotations

from typing import ClassVar

import torch

from .head_options import HeadDims
from .scaled_map import MapOptions
from .head_interface import Paper, TiedToEmbeddings, register_head
from .softmax import SoftmaxHead


class BilinearOptions(MapOptions):
    """`map_scale` of `W_l`: 0.1 from scratch (at the backbone's rate `W_l` made the head worse than
    `tied`), 1 converted (measured)."""

    scratch_defaults: ClassVar[dict] = {"map_scale": 0.1}
    conversion_defaults: ClassVar[dict] = {"map_scale": 1.0}


@register_head
class BilinearHead(TiedToEmbeddings, SoftmaxHead):
    head_type = "bilinear"
    Options = BilinearOptions
    papers = (Paper("Colorless Green Recurrent Networks Dream Hierarchically", "https://aclanthology.org/N18-1108", """\
@inproceedings{gulordava-etal-2018-colorless,
  title = {Colorless Green Recurrent Networks Dream Hierarchically},
  author = {Gulordava, Kristina and Bojanowski, Piotr and Grave, Edouard and Linzen, Tal and Baroni, Marco},
  booktitle = {Proceedings of the 2018 Conference of the North American Chapter of the Association for Computational Linguistics: Human Language Technologies},
  year = {2018},
  pages = {1195--1205}
}""", arxiv="1803.11138"),)
    exact_plain_export = exact_conversion = True

    def __init__(self, options: BilinearOptions, dims: HeadDims):
        super().__init__(options, dims)
        self.map = self.options.scaled_map(dims.hidden_dim, dims.embed_dim, False)  # W_l

    def reset_parameters(self) -> None:
        self.map.reset()
        self.reset_bias()
        self.reset_label_source()

    def label_matrix(self, embeddings: torch.Tensor) -> torch.Tensor:
        return embeddings

    def context(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.map(hidden)

    def context_flops(self) -> int:
        return 2 * self.dims.embed_dim * self.dims.hidden_dim

    def context_map(self):
        return self.map.effective_weight(), None  # W_l h
    def init_from_lm_head(self, weight, bias, embeddings) -> bool:
        """`W_l = I` reproduces a tied original exactly. For an untied original (or d != d_h)
        `W_l` is the least-squares fit of `E W_l ~= W` (approximate; returns False)."""
        exact_bias = self.copy_bias(bias)
        with torch.no_grad():
            if weight.shape == embeddings.shape and torch.equal(weight, embeddings):
                self.map.set_effective_weight(torch.eye(self.dims.embed_dim, dtype=weight.dtype))
                return exact_bias
            fit = torch.linalg.lstsq(embeddings.double(), weight.double()).solution  # d x d_h; float64: see head_drill
            self.map.set_effective_weight(fit)
        return False
