"""hf_outheads: research output layers (DRILL, joint embedding, MoS, DOC, ...) for transformers models.

`import hf_outheads` registers `OutHeadsConfig` with `AutoConfig` and imports no modelling code:
the model classes (and `transformers.modeling_utils`, which costs more than torch itself) are
imported when first used, as `hf_outheads.OutHeadsForCausalLM` or when an `OutHeadsConfig` is
built (every `Auto*.from_pretrained` / `from_config` of this model type builds one first), and
registered with `AutoModel`, `AutoModelForCausalLM` and `AutoModelForSeq2SeqLM` then.

Its files import downward, in layers: option declarations and the head interface (with the head
registry, `register_head`); the model's inputs, outputs and library hooks (`model_io`); the heads'
shared parts (losses and their kernels, the single softmax, scaled maps, latents); the heads (a head
on the parts it is made of); their catalog; the config; the model classes; this face. One
call-time import runs upward: the config imports the model classes when one is first built
(`configuration_outheads.import_model_classes`), so that this import stays light. The tools
(conversion, the plain export, model cards, folders, FLOP counting, frequency bands, the GPU
kernels) stand above them all: the model reaches them at call time (`model_io.package_tool`), so a
saved folder carries the runtime alone.
"""

from transformers import AutoConfig

from .configuration_outheads import OutHeadsConfig
from .head_catalog import HEAD_CLASSES, get_head_class
from .head_interface import IGNORE_INDEX, HeadInputs, HeadOutput, OutputHead, next_token_labels, register_head
from .head_options import HeadDims, HeadOptions
from .softmax import SoftmaxHead, SoftmaxOptions

AutoConfig.register(OutHeadsConfig.model_type, OutHeadsConfig, exist_ok=True)

_MODELING = ("OutHeadsCausalLMOutput", "OutHeadsForCausalLM", "OutHeadsForSeq2SeqLM", "OutHeadsPreTrainedModel",
             "OutHeadsSeq2SeqLMOutput")


def __getattr__(name: str):
    if name in _MODELING:
        from . import modeling_outheads

        return getattr(modeling_outheads, name)
    raise AttributeError(f"module 'hf_outheads' has no attribute '{name}'")


__version__ = "0.1.0"
__all__ = [
    "HEAD_CLASSES",
    "IGNORE_INDEX",
    "HeadDims",
    "HeadInputs",
    "HeadOptions",
    "HeadOutput",
    "OutHeadsCausalLMOutput",
    "OutHeadsConfig",
    "OutHeadsForCausalLM",
    "OutHeadsForSeq2SeqLM",
    "OutHeadsPreTrainedModel",
    "OutHeadsSeq2SeqLMOutput",
    "OutputHead",
    "SoftmaxHead",
    "SoftmaxOptions",
    "get_head_class",
    "next_token_labels",
    "register_head",
]
