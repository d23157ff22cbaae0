"""LoRA adapters on the backbone through PEFT (`use_peft`, with TRL's `ModelConfig` names: `lora_r`,
`lora_alpha`, `lora_dropout`, `lora_target_modules`). The backbone's chosen modules get adapters and
stay frozen; the head, which a conversion makes new, trains fully as PEFT's `modules_to_save`. A
finished run saves both: the merged model in output_dir (it loads with `AutoModelForCausalLM`,
exports and serves as any run's) and the adapter in output_dir/adapter (`PeftModel.from_pretrained`
on the converted backbone, training/README.md). Checkpoints hold the wrapped model's state, so that a
resumed run wraps the model alike and goes on."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from hf_outheads.tools.folders import SAVING_PREFIX

ADAPTER_FOLDER = "adapter"  # output_dir/adapter: the PEFT adapter of a `use_peft` run
ALL_LINEAR = "all-linear"


def target_modules(model, names: list[str]) -> list[str]:
    """The full names of the backbone's modules that get adapters: those whose own name is one of
    `names` (`lora_target_modules`; `all-linear`: every linear layer of the backbone), by default
    PEFT's choice for the backbone's model type. Only modules under `backbone.`: the head trains
    fully. A ValueError names what matched nothing and the backbone's module names."""
    import torch
    from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING
    from transformers.pytorch_utils import Conv1D

    backbone = {name: module for name, module in model.named_modules() if name.startswith("backbone.")}
    model_type = model.config.text_config.model_type
    wanted = list(names) or TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING.get(model_type, [])
    if not wanted:
        raise ValueError(f"Option lora_target_modules: PEFT has no default for the {model_type} backbone; name its "
                         "modules, e.g. [q_proj, v_proj], or give [all-linear].")
    if wanted == [ALL_LINEAR]:
        found = [name for name, module in backbone.items() if isinstance(module, (torch.nn.Linear, Conv1D))]
    else:
        found = [name for name in backbone if name.rsplit(".", 1)[-1] in wanted]
    missing = [name for name in wanted if name != ALL_LINEAR and not any(f.rsplit(".", 1)[-1] == name for f in found)]
    if missing or not found:
        leaves = sorted({name.rsplit(".", 1)[-1] for name in backbone if not name.rsplit(".", 1)[-1].isdigit()})
        raise ValueError(f"Option lora_target_modules: {missing or wanted} names no module of the {model_type} "
                         f"backbone; its modules are named {', '.join(leaves)}.")
    return found


def with_lora(model, model_options):
    """`model` wrapped by PEFT (`get_peft_model`): LoRA adapters on `target_modules`, the head trained
    fully (`modules_to_save`); every other parameter frozen."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=model_options.lora_r, lora_alpha=model_options.lora_alpha,
                        lora_dropout=model_options.lora_dropout,
                        target_modules=target_modules(model, model_options.lora_target_modules),
                        modules_to_save=["head"])
    return get_peft_model(model, config)


def merged_and_adapter(peft_model, where) -> tuple[object, Path]:
    """(the merged model, a folder holding the adapter): the adapter saved by PEFT
    (`save_pretrained`) into a new folder under `where`, then the adapters merged into the backbone and
    the trained head put in place (`merge_and_unload`). The caller moves the folder into the run's
    folder (`publish.finish_run`)."""
    folder = Path(tempfile.mkdtemp(prefix=f"{SAVING_PREFIX}adapter-", dir=where))  # removed by a later finish if left
    peft_model.save_pretrained(folder)
    return peft_model.merge_and_unload(), folder


def move_adapter(saved: Path, folder) -> None:
    """The adapter saved by `merged_and_adapter` moved to folder/adapter."""
    shutil.move(str(saved), str(Path(folder) / ADAPTER_FOLDER))
