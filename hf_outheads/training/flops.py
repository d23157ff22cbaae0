"""Analytic training FLOPs of a wrapped model: the backbone plus the head, forward and backward.

A FLOP count does not depend on the machine, so runs on different hardware (or sharing a
busy CPU) compare at equal compute. The backbone is counted as in Kaplan et al. 2020 (Sec.
2.1, Table 1): `2 P` FLOPs per token in the forward pass, `P` the parameters used in matrix
products (embedding tables are looked up), plus `4 n_layer n_ctx d` for the attention's
score and value products (both full `n_ctx x n_ctx` products, as the kernels compute them;
Kaplan counts `2 n_layer n_ctx d`); an encoder-decoder counts its encoder over source tokens
and its decoder over target tokens (self- and cross-attention). The head adds
`head.forward_flops(N)` (its matrix products, a label encoder once per forward). A
backward costs twice a forward (the gradients for inputs and for weights), so a training
step is 3 forwards. Element-wise work (norms, activations, softmax) is not counted.
"""

from __future__ import annotations

from torch import nn

from hf_outheads.backbones import num_layers


def _matmul_parameters(module: nn.Module) -> int:
    """Parameters of `module` used in matrix products per token: every >= 2-d weight except
    embedding tables (looked up, not multiplied)."""
    embeddings = {id(m.weight) for m in module.modules() if isinstance(m, nn.Embedding)}
    return sum(p.numel() for p in module.parameters() if p.dim() >= 2 and id(p) not in embeddings)


def _width(config) -> int:
    return next(getattr(config, a) for a in ("hidden_size", "d_model", "n_embd") if getattr(config, a, None))


def _stack_flops(module: nn.Module, layers: int, width: int, tokens: int, context: int) -> int:
    """Forward FLOPs of a layer stack over `tokens` tokens attending to `context` positions."""
    return tokens * (2 * _matmul_parameters(module) + 4 * layers * context * width)


def training_flops_per_step(model, target_tokens: int, target_context: int, source_tokens: int = 0,
                            source_context: int = 0) -> int:
    """FLOPs of one training step (forward and backward) of an `OutHeads*` model over
    `target_tokens` scored positions (causal LM: all positions; seq2seq: decoder positions)
    with sequences of `target_context` positions, and `source_tokens` encoder positions of
    `source_context` (seq2seq only). The head is counted by `head.forward_flops`."""
    backbone, config = model.backbone, model.config.text_config
    width = _width(config)
    if getattr(config, "is_encoder_decoder", False):
        encoder, decoder = backbone.get_encoder(), backbone.get_decoder()
        enc_layers = getattr(config, "encoder_layers", None) or getattr(config, "num_layers")
        forward = _stack_flops(encoder, enc_layers, width, source_tokens, source_context)
        # decoder: self-attention over the target and cross-attention over the source
        forward += _stack_flops(decoder, num_layers(config), width, target_tokens, target_context + source_context)
    else:
        forward = _stack_flops(backbone, num_layers(config), width, target_tokens, target_context)
    forward += model.head.forward_flops(target_tokens)
    return 3 * int(forward)
