"""The README model card that `push_to_hub` uploads with an `OutHeadsFor*` model.

Rendered from the model itself (head type and options, backbone, sizes), offline: no
template download, no `ModelCard.validate()` (both need the network).
"""

from __future__ import annotations

import inspect
import json

from huggingface_hub import ModelCard, ModelCardData

PLACEHOLDER_REPO = "<namespace>/<model-name>"


def head_summary(head) -> str:
    """First paragraph of the head's module docstring (the equation and the paper)."""
    doc = inspect.getdoc(inspect.getmodule(head)) or inspect.getdoc(type(head)) or ""
    return doc.split("\n\n")[0].replace("\n", " ")


def options_section(options: dict | None) -> str:
    if not options:
        return "This head takes no options."
    listing = json.dumps(options, indent=2, sort_keys=True)
    return f"Head options (every value used, defaults included):\n\n```json\n{listing}\n```"


def usage_code(repo_id: str, auto_class: str) -> str:
    return f'''```python
from transformers import {auto_class}

# The modelling code travels with the checkpoint: no extra install needed.
model = {auto_class}.from_pretrained("{repo_id}", trust_remote_code=True)
# Or, with the hf_outheads package installed, `import hf_outheads` registers the classes and
# {auto_class}.from_pretrained("{repo_id}") works without remote code.
outputs = model.generate(input_ids, max_new_tokens=20)  # ids from the backbone's tokenizer
```'''


def build_model_card(model, repo_id: str | None = None, tags: list[str] | None = None) -> ModelCard:
    """A `ModelCard` describing `model` (an `OutHeadsPreTrainedModel`)."""
    config, text = model.config, model.config.text_config
    seq2seq = bool(config.is_encoder_decoder)
    auto_class = "AutoModelForSeq2SeqLM" if seq2seq else "AutoModelForCausalLM"
    base_tags = ["hf_outheads", f"outheads-{config.head_type}", text.model_type, "custom_code"]
    data = ModelCardData(
        library_name="transformers",
        pipeline_tag="text2text-generation" if seq2seq else "text-generation",
        tags=list(dict.fromkeys(base_tags + list(tags or []))),
    )
    head_params = sum(p.numel() for p in model.head.parameters())
    body = f"""# {type(model).__name__}: `{text.model_type}` backbone with the `{config.head_type}` output head

A `{text.model_type}` {"encoder-decoder" if seq2seq else "decoder-only"} backbone whose LM head is replaced by the
`{config.head_type}` output head of the `hf_outheads` package.

**Head.** {head_summary(model.head)}

| | |
|---|---|
| head type | `{config.head_type}` |
| backbone `model_type` | `{text.model_type}` |
| vocabulary size | {config.vocab_size} |
| hidden width d_h / embedding width d | {model.head.dims.hidden_dim} / {model.head.dims.embed_dim} |
| parameters (head / total) | {head_params:,} / {model.num_parameters():,} |

{options_section(config.head_options)}

## Usage

{usage_code(repo_id or PLACEHOLDER_REPO, auto_class)}

The tokenizer is the backbone's: upload it next to the model (`tokenizer.push_to_hub`).
"""
    return ModelCard(f"---\n{data.to_yaml()}\n---\n\n{body}")
