"""The vLLM plugin: `vllm serve RUN` and `vllm.LLM(RUN)` serve a saved `OutHeadsForCausalLM` of every causal head.

Installed with the package: pyproject.toml names `register` under the `vllm.general_plugins` entry point, which
vLLM calls in each of its processes before it reads a model. `register` registers the package's config with
transformers' `AutoConfig` (so vLLM reads config.json with the package's own classes, not a saved folder's remote
code) and `OutHeadsVllmModel` with vLLM's model registry under the saved architecture's name.

`OutHeadsVllmModel` is vLLM's own implementation of the backbone's family (the `text_config`'s `model_type`, looked
up in vLLM's registry through transformers' causal-LM class name for it: `LlamaForCausalLM`, `Qwen2ForCausalLM`,
`MistralForCausalLM`, `GPT2LMHeadModel`, ...) without its LM head, and the package's head, built from the saved
config and loaded from the saved weights under the head's names. vLLM runs the backbone (paged attention, batching)
and calls `compute_logits` with the final hidden states of the positions it samples or scores; the head turns them
into scores, or into normalised log-probabilities for `mos`, `doc` and `lightrnn`, which vLLM's sampler (a
log-softmax first) leaves unchanged. A mixture's log-probabilities are computed in row chunks by the head's own code
(`mixture.mixture_log_probs`): a long prompt scored with prompt log-probs never holds positions x K x |V| at once.
`doc` reads middle layers: the backbone hands them over through vLLM's auxiliary hidden states (the residual
stream after a layer, as transformers' `hidden_states`), which the families with EAGLE-3 support have (Llama,
Qwen2, Mistral); on another family `doc` is refused by name. `mtp` is served as its next-token model; its
future-token predictors are not used as vLLM's speculative drafter.

What vLLM cannot serve is refused when it loads the model, in one line naming the head or the family: an
encoder-decoder model, a family vLLM does not implement, `doc` on a family without middle-layer states, tensor
parallelism (vLLM would shard the embedding matrix the head reads whole); vLLM itself refuses pipeline parallelism
(the class does not declare it).
"""

from __future__ import annotations

import torch
from torch import nn

ARCHITECTURES = ("OutHeadsForCausalLM", "OutHeadsForSeq2SeqLM")  # a saved config's `architectures`
MODEL_CLASS = f"{__name__}:OutHeadsVllmModel"


def register() -> None:
    """The `vllm.general_plugins` entry point: the package's config in `AutoConfig` and the model class in vLLM's
    registry (by name: vLLM imports this module where it inspects or builds the model). Safe to call again."""
    from vllm import ModelRegistry

    from hf_outheads.configuration_outheads import OutHeadsConfig  # noqa: F401  (registers it with AutoConfig)

    for name in ARCHITECTURES:
        if name not in ModelRegistry.get_supported_archs():
            ModelRegistry.register_model(name, MODEL_CLASS)


def refusal(name: str) -> ValueError:
    """The one-line error vLLM shows when it cannot load the model."""
    return ValueError(f"hf_outheads on vLLM: {name}")


def backbone_architecture(config) -> str:
    """vLLM's architecture name for the backbone's family (transformers' causal-LM class of the `text_config`'s
    `model_type`), or a refusal naming the family: an encoder-decoder model or a family vLLM does not implement."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    from vllm import ModelRegistry

    family = config.text_config.model_type
    if config.is_encoder_decoder:
        raise refusal(f"the '{family}' backbone is an encoder-decoder model, which this plugin does not serve "
                      "(decoder-only families only); generate with it in Python (model.generate).")
    architecture = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(family)
    if architecture is None or architecture in ARCHITECTURES or architecture not in ModelRegistry.get_supported_archs():
        raise refusal(f"vLLM has no implementation of the '{family}' family ({architecture or 'no causal-LM class'}) "
                      "to run this model's backbone; serve it with hf-outheads serve.")
    return architecture


def base_model_prefix(architecture: str) -> str:
    """Where transformers' causal-LM class of the family keeps its backbone (`model`, GPT-2's `transformer`): the
    names vLLM's implementation loads the backbone's weights under."""
    import transformers

    return getattr(transformers, architecture).base_model_prefix


def input_embedding(module: nn.Module) -> nn.Module:
    """vLLM's vocabulary embedding of the backbone (its rows padded past the vocabulary)."""
    from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding

    return next(m for m in module.modules() if isinstance(m, VocabParallelEmbedding))


class OutHeadsVllmModel(nn.Module):
    """vLLM's backbone of the family, without its LM head, and the package's head in `compute_logits`."""

    def __init__(self, *, vllm_config, prefix: str = ""):
        super().__init__()
        from vllm.model_executor.models.utils import PPMissingLayer, init_vllm_registered_model, maybe_prefix

        from hf_outheads.backbones import head_dims

        config = vllm_config.model_config.hf_config
        self.config, text = config, config.text_config
        architecture = backbone_architecture(config)
        if vllm_config.parallel_config.tensor_parallel_size > 1:  # the head reads the whole embedding matrix
            raise refusal(f"head '{config.head_type}' runs on one device: serve it without tensor parallelism "
                          "(--tensor-parallel-size 1), or several copies of it (--data-parallel-size).")
        self.weights_prefix = base_model_prefix(architecture)
        self.backbone = init_vllm_registered_model(vllm_config, hf_config=text, architectures=[architecture],
                                                   prefix=maybe_prefix(prefix, "backbone"))
        self.backbone.lm_head = PPMissingLayer()  # the package's head scores instead
        self.head = config.head_class(config.resolved_head_options, head_dims(text))
        self.layers = self.head.layer_indices  # middle layers the head reads (doc's)
        if self.layers:
            inner = getattr(self.backbone, "model", None)
            if not hasattr(inner, "_set_aux_hidden_state_layers"):
                raise refusal(f"head '{config.head_type}' reads middle layers {list(self.layers)}, which vLLM's "
                              f"'{text.model_type}' backbone does not hand over; serve it with hf-outheads serve.")
            inner._set_aux_hidden_state_layers(self.layers)
        self.hidden_scale = float(config.hidden_scale)
        self.embedding = [input_embedding(self.backbone)]  # (a list: not a second owner of its weight)
        self.make_empty_intermediate_tensors = getattr(self.backbone, "make_empty_intermediate_tensors", None)

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.backbone.embed_input_ids(input_ids)

    def forward(self, input_ids, positions, intermediate_tensors=None, inputs_embeds=None, **kwargs) -> torch.Tensor:
        """The backbone's final hidden states; with the middle layers the head reads concatenated after them
        (`compute_logits` splits them), so that vLLM picks the same positions of each."""
        out = self.backbone(input_ids, positions, intermediate_tensors, inputs_embeds)
        if isinstance(out, tuple):
            hidden, layers = out
            return torch.cat([hidden, *layers], dim=-1)
        return out

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """The head's scores (or log-probabilities) of every word at each given position, `(positions, |V|)`."""
        from hf_outheads.head_interface import HeadInputs

        parts = hidden_states.split(self.head.dims.hidden_dim, dim=-1)
        embeddings = self.embedding[0].weight[: self.head.dims.vocab_size]
        inputs = HeadInputs(parts[0] * self.hidden_scale, embeddings, dict(zip(self.layers, parts[1:])),
                            return_logits=True)
        return self.head(inputs).logits

    def load_weights(self, weights) -> set[str]:
        """The saved `backbone.*` weights into vLLM's backbone (under its family's names), `head.*` into the head."""
        head_state: dict[str, torch.Tensor] = {}

        def backbone_weights():
            for name, tensor in weights:
                if name.startswith("head."):
                    head_state[name.removeprefix("head.")] = tensor
                elif name.startswith("backbone."):
                    yield f"{self.weights_prefix}.{name.removeprefix('backbone.')}", tensor

        loaded = {f"backbone.{name}" for name in self.backbone.load_weights(backbone_weights())}
        self.head.load_state_dict(head_state)
        self.head.check_state()
        return loaded | {f"head.{name}" for name, _ in self.head.named_parameters()}
