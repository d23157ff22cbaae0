"""hf_outheads: research output layers (DRILL, joint embedding, MoS, DOC, ...) for transformers models."""

from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoModelForSeq2SeqLM

from .configuration_outheads import OutHeadsConfig
from .head_catalog import HEAD_CLASSES, get_head_class
from .head_interface import IGNORE_INDEX, HeadInputs, HeadOutput, OutputHead
from .options import HeadDims, HeadOptions
from .softmax import SoftmaxHead, SoftmaxOptions
from .modeling_outheads import (
    OutHeadsCausalLMOutput,
    OutHeadsForCausalLM,
    OutHeadsForSeq2SeqLM,
    OutHeadsPreTrainedModel,
    OutHeadsSeq2SeqLMOutput,
)

AutoConfig.register(OutHeadsConfig.model_type, OutHeadsConfig, exist_ok=True)
AutoModel.register(OutHeadsConfig, (OutHeadsForCausalLM, OutHeadsForSeq2SeqLM), exist_ok=True)
AutoModelForCausalLM.register(OutHeadsConfig, OutHeadsForCausalLM, exist_ok=True)
AutoModelForSeq2SeqLM.register(OutHeadsConfig, OutHeadsForSeq2SeqLM, exist_ok=True)

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
]
