"""hf_outheads: research output layers (DRILL, joint embedding, MoS, DOC, ...) for transformers models.

`import hf_outheads` imports nothing else, as `import transformers` does: each name below is imported
from its module when first used (`hf_outheads.OutHeadsForCausalLM`, `from hf_outheads import
OutHeadsConfig`), so that `hf-outheads --help` answers before torch is loaded. Using the config or a
model class registers them with the Auto classes (`configuration_outheads` registers `OutHeadsConfig`
with `AutoConfig`; `modeling_outheads` the model classes with `AutoModel`, `AutoModelForCausalLM`
and `AutoModelForSeq2SeqLM`), and building an `OutHeadsConfig` imports the model classes.

Two folders. `hf_outheads/` is the runtime: what a saved model carries (transformers' remote code
copies the files the config and model import) and needs to load, run `forward` and `generate`. Its
files import downward, in layers: option declarations and the head interface (with the head
registry, `register_head`); the model's inputs, outputs and library hooks (`model_io`); the heads'
shared parts (losses and the kernel choice, the single softmax, scaled maps, latents); the heads (a
head on the parts it is made of); their catalog; the config; the model classes; this face. One
call-time import runs upward: the config imports the model classes when one is first built
(`configuration_outheads.import_model_classes`).

`hf_outheads/tools/` holds what the installed package alone runs: conversion, the plain export,
model cards, folders, FLOP counting, frequency bands, the Triton kernels and the `hf-outheads`
command. They import the runtime; the runtime reaches them at call time through one door,
`model_io.package_tool`, never by an import statement, so a saved folder carries the runtime alone.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

__version__ = "0.1.0"

_NAMES = {  # name -> the module that defines it (imported on first use: `__getattr__`)
    "OutHeadsConfig": "configuration_outheads",
    "HEAD_CLASSES": "head_catalog",  # the registry, filled by importing every head (head_catalog)
    "get_head_class": "head_catalog",
    "IGNORE_INDEX": "head_interface",
    "HeadInputs": "head_interface",
    "HeadOutput": "head_interface",
    "OutputHead": "head_interface",
    "next_token_labels": "head_interface",
    "register_head": "head_interface",
    "HeadDims": "head_options",
    "HeadOptions": "head_options",
    "SoftmaxHead": "softmax",
    "SoftmaxOptions": "softmax",
    "OutHeadsCausalLMOutput": "modeling_outheads",
    "OutHeadsForCausalLM": "modeling_outheads",
    "OutHeadsForSeq2SeqLM": "modeling_outheads",
    "OutHeadsPreTrainedModel": "modeling_outheads",
    "OutHeadsSeq2SeqLMOutput": "modeling_outheads",
}
__all__ = sorted(_NAMES)

if TYPE_CHECKING:
    from .configuration_outheads import OutHeadsConfig
    from .head_catalog import HEAD_CLASSES, get_head_class
    from .head_interface import IGNORE_INDEX, HeadInputs, HeadOutput, OutputHead, next_token_labels, register_head
    from .head_options import HeadDims, HeadOptions
    from .modeling_outheads import (OutHeadsCausalLMOutput, OutHeadsForCausalLM, OutHeadsForSeq2SeqLM,
                                    OutHeadsPreTrainedModel, OutHeadsSeq2SeqLMOutput)
    from .softmax import SoftmaxHead, SoftmaxOptions


def __getattr__(name: str):
    if name not in _NAMES:
        raise AttributeError(f"module 'hf_outheads' has no attribute '{name}'")
    value = globals()[name] = getattr(importlib.import_module(f".{_NAMES[name]}", __name__), name)
    return value


def __dir__():
    return sorted({*globals(), *_NAMES})
