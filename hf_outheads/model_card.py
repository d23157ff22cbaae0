"""Every model card of an `OutHeadsFor*` model: the README `push_to_hub` uploads, the card a
training script writes (its run added as sections, `build_model_card`) and a plain export's.

Rendered from the model itself (head type and options, backbone, sizes), offline: no
template download, no `ModelCard.validate()` (both need the network).
"""

from __future__ import annotations

import inspect
import json
import os

from .head_catalog import get_head_class

PLACEHOLDER_REPO = "<namespace>/<model-name>"


def head_papers(head_type: str):
    """The papers of `head_type` (its class's `papers`): `arxiv:<id>` tags, which the Hub links
    to the paper pages, and the citation section."""
    return get_head_class(head_type).papers


def paper_tags(head_type: str) -> list[str]:
    return [f"arxiv:{paper.arxiv}" for paper in head_papers(head_type) if paper.arxiv]


def citation_section(head_type: str) -> str | None:
    """Markdown naming the head's papers with their BibTeX (None: it cites none), for a card's
    "Citation" section."""
    papers = head_papers(head_type)
    if not papers:
        return None
    links = ", ".join(f"[{paper.title}]({paper.url})" for paper in papers)
    bibtex = "\n".join(paper.bibtex.strip() for paper in papers)
    return f"Paper{'s' if len(papers) > 1 else ''}: {links}.\n\n```bibtex\n{bibtex}\n```"


def model_tags(config) -> list[str]:
    """Tags of every card of an `OutHeadsFor*` model (also `model.model_tags`, which
    `Trainer.push_to_hub` and TRL's trainers put in the cards they write): the package, the
    head, the backbone family, remote code and the head's papers."""
    text = config.text_config
    tags = ["hf_outheads", f"outheads-{config.head_type}", text.model_type, "custom_code"]
    return tags + paper_tags(config.head_type)


def pipeline_tag(auto_class: str) -> str:
    """The transformers pipeline task (`transformers.pipelines.SUPPORTED_TASKS`) that runs
    `auto_class`; "text-generation" when none does (transformers 5 has no seq2seq text task:
    `text2text-generation` is gone, and `text-generation` is the task of generating text)."""
    from transformers.pipelines import SUPPORTED_TASKS

    for task, spec in SUPPORTED_TASKS.items():
        if any(getattr(cls, "__name__", None) == auto_class for cls in spec.get("pt", ())):
            return task
    return "text-generation"


def hub_base_model(value: str | None) -> str | None:
    """`config.base_model` when it names a Hub repository (a local folder is no card metadata)."""
    if not value or os.path.isabs(value) or os.path.isdir(value) or value.count("/") > 1:
        return None
    return value


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
    """Code that loads and runs the model without the package: both loads need `trust_remote_code`
    (AutoTokenizer reads the model's config, whose type is this package's, and without the flag stops
    at transformers' interactive "run the custom code?" prompt)."""
    return f'''from transformers import {auto_class}, AutoTokenizer

# The modelling code travels with the checkpoint: no extra install needed.
model = {auto_class}.from_pretrained("{repo_id}", trust_remote_code=True)
# the backbone's tokenizer, uploaded beside the model (the repository's config names the remote code, hence the flag)
tokenizer = AutoTokenizer.from_pretrained("{repo_id}", trust_remote_code=True)
# Or, with the hf_outheads package installed, `import hf_outheads` registers the classes and both
# calls work without trust_remote_code.
inputs = tokenizer("The", return_tensors="pt")
outputs = model.generate(**inputs, max_new_tokens=20)
print(tokenizer.decode(outputs[0], skip_special_tokens=True))'''


def build_model_card(model, repo_id: str | None = None, tags: list[str] | None = None, usage: str | None = None,
                     sections: dict[str, str] | None = None, **card_data):
    """A `huggingface_hub.ModelCard` describing `model` (an `OutHeadsPreTrainedModel`): the one
    card builder. Metadata: `model_tags` and `hub_base_model` (a local path is never
    `base_model`). A training script describes its run with `usage` (Python code that replaces
    the generic usage example, e.g. code that generates the card's sample again), `sections`
    (`{title: markdown}`, appended as `## title` sections: data, procedure, results, plots,
    sample, citation) and `card_data` (further `ModelCardData` fields: `license`, `datasets`,
    `model_name`, `eval_results`)."""
    from huggingface_hub import ModelCard, ModelCardData

    config, text = model.config, model.config.text_config
    seq2seq = bool(config.is_encoder_decoder)
    auto_class = "AutoModelForSeq2SeqLM" if seq2seq else "AutoModelForCausalLM"
    origin = getattr(config, "base_model", None)
    data = ModelCardData(
        library_name="transformers",
        pipeline_tag=pipeline_tag(auto_class),
        base_model=hub_base_model(origin),
        tags=list(dict.fromkeys(model_tags(config) + list(tags or []))),
        **card_data,
    )
    note = ("The tokenizer is the backbone's: upload it next to the model (`tokenizer.push_to_hub`)." if usage is None
            else "Without the `hf_outheads` package installed, drop `import hf_outheads` and pass `trust_remote_code=True` "
                 "to both `from_pretrained` calls (the tokenizer's reads the model's config): the modelling code is "
                 "saved with the weights.")
    extra = "".join(f"\n## {title}\n\n{body.strip()}\n" for title, body in (sections or {}).items())
    head_params = sum(p.numel() for p in model.head.parameters())
    body = f"""# {type(model).__name__}: `{text.model_type}` backbone with the `{config.head_type}` output head

A `{text.model_type}` {"encoder-decoder" if seq2seq else "decoder-only"} backbone whose LM head is replaced by the
`{config.head_type}` output head of the `hf_outheads` package.{f" Converted from `{origin}` (`from_backbone`)." if origin else ""}

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

```python
{usage or usage_code(repo_id or PLACEHOLDER_REPO, auto_class)}
```

{note}
{extra}"""
    return ModelCard(f"---\n{data.to_yaml()}\n---\n\n{body}")


def build_plain_model_card(model, export, repo_id: str | None = None, license: str | None = None,
                           tokenizer: bool = True):
    """The README of a plain export (`export_plain`): the stock class it loads as, the head it
    was trained with (and its papers), and whether its logits are the trained model's; usage
    code that loads `repo_id` (default: the export's folder), with its tokenizer when one was saved."""
    from huggingface_hub import ModelCard, ModelCardData

    config, text = model.config, model.config.text_config
    auto_class = "AutoModelForSeq2SeqLM" if config.is_encoder_decoder else "AutoModelForCausalLM"
    papers = paper_tags(config.head_type)
    data = ModelCardData(library_name="transformers", pipeline_tag=pipeline_tag(auto_class),
                         base_model=hub_base_model(getattr(config, "base_model", None)),
                         tags=[text.model_type, f"outheads-{config.head_type}", "hf_outheads-export", *papers],
                         license=license)
    repo_id = repo_id or export.path
    generate = (f'''
tokenizer = AutoTokenizer.from_pretrained("{repo_id}")
inputs = tokenizer("The", return_tensors="pt")
outputs = model.generate(**inputs, max_new_tokens=20)
print(tokenizer.decode(outputs[0], skip_special_tokens=True))''' if tokenizer else "")
    if export.exact:
        fidelity = ("Its logits are the trained model's (up to float rounding): the head's scores were folded "
                    "into the output matrix exactly.")
    else:
        fidelity = (f"It is an approximation: {export.architecture} adds no output bias to its logits, so the "
                    "head's per-word bias was dropped.")
    if export.mean_kl is not None:
        fidelity += f" Mean KL divergence from the trained model's next-token distributions on the text given at export: {export.mean_kl:.3g} nats per position."
    body = f"""# `{text.model_type}` trained with the `{config.head_type}` output head, exported as `{export.architecture}`

This checkpoint was trained with the `{config.head_type}` output head of the `hf_outheads` package and
exported as the backbone's own transformers class (`model.export_plain`): the head's inference-time
label matrix (and its context map, where it has one) became the output matrix. {fidelity}

**Head it was trained with.** {head_summary(model.head)}

{options_section(config.head_options)}

## Usage

```python
from transformers import {auto_class}{", AutoTokenizer" if tokenizer else ""}

# A stock {export.architecture}: no hf_outheads, no trust_remote_code.
model = {auto_class}.from_pretrained("{repo_id}"){generate}
```

Serving stacks, converters and quantizers that know `{export.architecture}` run it as is. Training it
further trains a plain `{export.architecture}`, not the `{config.head_type}` head.
"""
    return ModelCard(f"---\n{data.to_yaml()}\n---\n\n{body}")
