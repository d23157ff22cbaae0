"""The modules of the `mtp` head's future-token predictors: one pre-norm transformer block
(`FutureBlock`) per predicted future token, the sequential form's input merge (DeepSeek-V3,
arXiv 2412.19437, Sec. 2.2, Eq. 21-22) and a croppable key/value cache (`BlockCache`) for
drafting during `generate`.

The block is the same for every backbone family: RMSNorm, causal multi-head self-attention,
RMSNorm, SwiGLU MLP, each with a residual (the Llama / DeepSeek layout). It has no position
encoding of its own: the states it reads come from the backbone, whose positions they carry, and
its causal mask orders them. Departure from both papers, whose block is a layer of the main
model's own architecture: a block built from the head's sizes alone works on any backbone
(GPT-2, Llama, ..., a seq2seq decoder) and needs nothing but torch, so saved models load with
remote code.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers import initialization as init

NORM_EPS = 1e-6


class BlockCache:
    """Keys and values of one `FutureBlock` over the positions it has seen while drafting,
    `(batch, heads, positions, head width)` each; `crop(length)` forgets the later positions."""

    def __init__(self):
        self.keys: torch.Tensor | None = None
        self.values: torch.Tensor | None = None

    def __len__(self) -> int:
        return 0 if self.keys is None else self.keys.shape[2]

    def append(self, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.keys is not None:
            keys, values = torch.cat([self.keys, keys], dim=2), torch.cat([self.values, values], dim=2)
        self.keys, self.values = keys, values
        return keys, values

    def crop(self, length: int) -> None:
        if self.keys is not None and length < len(self):
            self.keys, self.values = self.keys[:, :, :length], self.values[:, :, :length]


class FutureBlock(nn.Module):
    """`x + attention(norm(x))`, then `x + mlp(norm(x))`, `mlp(x) = W_out (silu(W_gate x) * W_up x)`;
    causal attention over the sequence, or over the cached positions and the new ones."""

    def __init__(self, width: int, heads: int, inner: int):
        super().__init__()
        self.heads = heads
        self.attention_norm = nn.RMSNorm(width, eps=NORM_EPS)
        self.qkv = nn.Linear(width, 3 * width, bias=False)
        self.attention_out = nn.Linear(width, width, bias=False)
        self.mlp_norm = nn.RMSNorm(width, eps=NORM_EPS)
        self.gate_up = nn.Linear(width, 2 * inner, bias=False)
        self.mlp_out = nn.Linear(inner, width, bias=False)

    def forward(self, x: torch.Tensor, cache: BlockCache | None = None) -> torch.Tensor:
        batch, length, width = x.shape
        q, k, v = self.qkv(self.attention_norm(x)).view(batch, length, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        past = 0 if cache is None else len(cache)
        if cache is not None:
            k, v = cache.append(k, v)
        mask = None
        if past and length > 1:  # new position i (absolute past + i) sees the cached ones and new ones up to i
            mask = torch.arange(past + length, device=x.device) <= past + torch.arange(length, device=x.device)[:, None]
        attended = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=not past and length > 1)
        x = x + self.attention_out(attended.transpose(1, 2).reshape(batch, length, width))
        gate, up = self.gate_up(self.mlp_norm(x)).chunk(2, dim=-1)
        return x + self.mlp_out(F.silu(gate) * up)

    def flops(self, num_positions: int, context: int) -> int:
        """Matrix-product FLOPs over `num_positions` positions, each attending to `context` positions."""
        width, inner = self.qkv.in_features, self.mlp_out.in_features
        return num_positions * (2 * width * (4 * width + 3 * inner) + 4 * context * width)


class FuturePredictor(nn.Module):
    """The module of one future token. Sequential form (DeepSeek-V3 Eq. 21-22): the state `h'_t =
    M [RMSNorm(e_{t+k}); RMSNorm(h^{k-1}_t)]` of the previous depth's state and the embedding of the
    token k ahead, then the block; independent form (Gloeckle et al. 2024): the block on the
    backbone's state. `norm` is the RMSNorm before the shared output head; the next depth reads the
    block's output before it."""

    def __init__(self, width: int, embed_width: int, heads: int, inner: int, reads_tokens: bool):
        super().__init__()
        self.token_norm = nn.RMSNorm(embed_width, eps=NORM_EPS) if reads_tokens else None
        self.hidden_norm = nn.RMSNorm(width, eps=NORM_EPS) if reads_tokens else None
        self.merge = nn.Linear(embed_width + width, width, bias=False) if reads_tokens else None
        self.block = FutureBlock(width, heads, inner)
        self.norm = nn.RMSNorm(width, eps=NORM_EPS)

    def forward(self, hidden: torch.Tensor, token_embeds: torch.Tensor | None = None,
                cache: BlockCache | None = None) -> torch.Tensor:
        x = hidden
        if self.merge is not None:
            x = self.merge(torch.cat([self.token_norm(token_embeds.to(hidden.dtype)), self.hidden_norm(hidden)], dim=-1))
        return self.block(x, cache)

    def reset_parameters(self, std: float = 0.02) -> None:
        """Linear maps N(0, std^2), norms 1; the merge starts as `[N(0, std^2) | I]`, passing the previous
        depth's state on (with its gradient) while the token's weights grow from noise."""
        for module in self.modules():
            if isinstance(module, nn.Linear) and module is not self.merge:
                init.normal_(module.weight, 0.0, std)
            elif isinstance(module, nn.RMSNorm):
                init.ones_(module.weight)
        if self.merge is not None:
            width, embed_width = self.merge.out_features, self.merge.in_features - self.merge.out_features
            weight = self.merge.weight
            start = torch.cat([torch.randn(width, embed_width, device=weight.device) * std,
                               torch.eye(width, device=weight.device)], dim=1)
            init.copy_(weight, start.to(weight.dtype))

    def flops(self, num_positions: int, context: int) -> int:
        merge = 0 if self.merge is None else 2 * self.merge.in_features * self.merge.out_features * num_positions
        return merge + self.block.flops(num_positions, context)
