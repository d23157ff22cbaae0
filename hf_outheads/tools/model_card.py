"""Every model card of an `OutHeadsFor*` model: the README `push_to_hub` uploads, the card a
training script writes (its run added as sections, `build_model_card`) and a plain export's
(`build_plain_model_card`), all rendered from the one template beside this file (`model_card.md`) by
huggingface_hub's `ModelCard.from_template` (Jinja).

Filled from the model itself (head type and options, backbone, sizes), offline: no template
download, no `ModelCard.validate()` (both need the network).
"""

from __future__ import annotations

import inspect
import json
import os
from importlib import resources

from ..model_io import PACKAGE, model_tags, paper_tags

PLACEHOLDER_REPO = "<namespace>/<model-name>"
TEMPLATE = resources.files(f"{PACKAGE}.tools") / "model_card.md"


def citation_section(head_class) -> str | None:
    """Markdown naming the papers of `head_class` (a model's `config.head_class`: its `papers`) with
    their BibTeX (None: it cites none), for a card's "Citation" section."""
    papers = head_class.papers
    if not papers:
        return None
    links = ", ".join(f"[{paper.title}]({paper.url})" for paper in papers)
    bibtex = "\n".join(paper.bibtex.strip() for paper in papers)
    return f"Paper{'s' if len(papers) > 1 else ''}: {links}.\n\n```bibtex\n{bibtex}\n```"


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


def render(card_data, model, **fields):
    """The card of `model` from the template: `card_data` (a `ModelCardData`, the YAML header) and
    the template's fields, those every card has (head, backbone, options) taken from `model`."""
    from huggingface_hub import ModelCard

    config = model.config
    options = json.dumps(config.head_options, indent=2, sort_keys=True) if config.head_options else None
    values = dict(head_type=config.head_type, model_type=config.text_config.model_type,
                  head_summary=head_summary(model.head), options_json=options, sections={}, export=None)
    with resources.as_file(TEMPLATE) as path:
        return ModelCard.from_template(card_data, template_path=str(path), **{**values, **fields})


def auto_class_of(config) -> str:
    return "AutoModelForSeq2SeqLM" if config.is_encoder_decoder else "AutoModelForCausalLM"


def build_model_card(model, repo_id: str | None = None, tags: list[str] | None = None, usage: str | None = None,
                     sections: dict[str, str] | None = None, **card_data):
    """A `huggingface_hub.ModelCard` describing `model` (an `OutHeadsPreTrainedModel`): the one
    card builder of a model with its head. Metadata: `model_tags` and `hub_base_model` (a local
    path is never `base_model`). A training script describes its run with `usage` (Python code that
    replaces the generic usage example, e.g. code that generates the card's sample again),
    `sections` (`{title: markdown}`, appended as `## title` sections: data, procedure, results,
    plots, sample, citation) and `card_data` (further `ModelCardData` fields: `license`,
    `datasets`, `model_name`, `eval_results`)."""
    from huggingface_hub import ModelCardData

    config = model.config
    auto_class = auto_class_of(config)
    origin = getattr(config, "base_model", None)
    data = ModelCardData(library_name="transformers", pipeline_tag=pipeline_tag(auto_class),
                         base_model=hub_base_model(origin),
                         tags=list(dict.fromkeys(model_tags(config) + list(tags or []))), **card_data)
    dims = model.head.dims
    return render(data, model, model_class=type(model).__name__, seq2seq=bool(config.is_encoder_decoder), origin=origin,
                  vocab_size=config.vocab_size, hidden_dim=dims.hidden_dim, embed_dim=dims.embed_dim,
                  head_params=sum(p.numel() for p in model.head.parameters()), total_params=model.num_parameters(),
                  auto_class=auto_class, repo_id=repo_id or PLACEHOLDER_REPO, usage=usage, sections=sections or {})


def build_plain_model_card(model, export, repo_id: str | None = None, license: str | None = None,
                           tokenizer: bool = True):
    """The README of a plain export (`export_plain`): the stock class it loads as, the head it
    was trained with (and its papers), and whether its logits are the trained model's; usage
    code that loads `repo_id` (default: the export's folder), with its tokenizer when one was saved."""
    from huggingface_hub import ModelCardData

    config = model.config
    auto_class = auto_class_of(config)
    data = ModelCardData(library_name="transformers", pipeline_tag=pipeline_tag(auto_class),
                         base_model=hub_base_model(getattr(config, "base_model", None)),
                         tags=[config.text_config.model_type, f"outheads-{config.head_type}", "hf_outheads-export",
                               *paper_tags(config.head_class)],
                         license=license)
    return render(data, model, export=export, auto_class=auto_class, repo_id=repo_id or export.path,
                  tokenizer=tokenizer)
