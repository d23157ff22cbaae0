"""The end of a run: save model, tokenizer and generation config, the run's options
(`train_config.yaml`, which `--config` reads again), plot the training curve, write the model card (`hf_outheads.tools.model_card.build_model_card`, with the run's data,
procedure, results, plot, sample and citations as sections), and optionally push it all to the Hub.

The finished folder appears whole: written beside it, then moved in with `config.json`, which marks a
finished model (`safeguards.earlier_work`) and without which none loads, last (`finish_run`). The
card is written before any push; a push that fails (`PushFailed`) leaves the complete folder and says
how to upload it later."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import yaml
from huggingface_hub import EvalResult, HfApi, ModelCard

from hf_outheads.tools.folders import SAVING_PREFIX, package_code_files, save_then_swap
from hf_outheads.tools.model_card import build_model_card, citation_section, pipeline_tag

from hf_outheads.training.data import BUILT_CORPORA, corpus_config
from hf_outheads.training.evaluation import SAMPLING
from hf_outheads.training.lora import ADAPTER_FOLDER, merged_and_adapter, move_adapter
from hf_outheads.training.options import CONFIG_FILE, saved_options
from hf_outheads.training.tracking import RESULTS_FILE, read_metrics

CURVE_FILE = "training_curve.png"
# eval key -> (model-index metric type, display name); BLEU etc. are on sacrebleu's 0-100 scale
CARD_METRICS = {
    "eval_perplexity": ("perplexity", "Perplexity"),
    "eval_loss": ("loss", "Token NLL (nats)"),
    "eval_sacrebleu": ("bleu", "BLEU (sacrebleu)"),
    "eval_chrf": ("chrf", "chrF"),
    "eval_rouge1": ("rouge", "ROUGE-1"),
    "eval_rouge2": ("rouge", "ROUGE-2"),
    "eval_rougeL": ("rouge", "ROUGE-L"),
    "eval_rougeLsum": ("rouge", "ROUGE-Lsum"),
}
HYPERPARAMETERS = ("seed", "max_steps", "num_train_epochs", "per_device_train_batch_size", "gradient_accumulation_steps",
                   "learning_rate", "lr_scheduler_type", "warmup_steps", "weight_decay", "max_grad_norm",
                   "mixed_precision", "dropout")
TASK_HYPERPARAMETERS = {"causal_lm": ("block_size",), "seq2seq": ("max_source_length", "max_target_length")}


def hyperparameters(options) -> dict:
    flat = options.flat()
    values = {key: flat[key] for key in HYPERPARAMETERS + TASK_HYPERPARAMETERS[options.model.task]}
    if options.training.max_steps is not None:
        values.pop("num_train_epochs")
    if values["dropout"] is None:
        values["dropout"] = "backbone default"
    if options.model.use_peft:  # the card states a LoRA run as such
        values.update({key: flat[key] for key in ("use_peft", "lora_r", "lora_alpha", "lora_dropout", "lora_target_modules")})
    return values


def plot_training_curve(output_dir: Path) -> Path | None:
    """Training loss and validation perplexity against steps; None without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    records = read_metrics(output_dir)
    train = [(r["step"], r["train_loss"]) for r in records if "train_loss" in r]
    evals = [(r["step"], r["eval_perplexity"]) for r in records if "eval_perplexity" in r]
    fig, left = plt.subplots(figsize=(6, 3.5))
    lines = left.plot(*zip(*train), label="training loss", color="tab:blue") if train else []
    left.set(xlabel="optimizer step", ylabel="training loss (nats)")
    if evals:
        right = left.twinx()
        lines += right.plot(*zip(*evals), "o-", label="validation perplexity", color="tab:red")
        right.set(ylabel="validation perplexity")
    left.legend(lines, [line.get_label() for line in lines], loc="upper right")
    fig.tight_layout()
    path = output_dir / CURVE_FILE
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


STDLIB_TASKS = {  # stdlib_docstrings config -> what the run learnt
    "text": "language modelling on the docstrings of the Python standard library",
    "summary": "writing a function's docstring summary line (its first sentence) from its qualified name and "
               "signature, on the Python standard library",
    "restore": "restoring the case and punctuation of the sentences of the Python standard library's docstrings "
               "(the source is the sentence lowercased, without punctuation)",
    "restore_short": "restoring the case and punctuation of the short sentences (6 to 16 words) of the Python "
                     "standard library's docstrings (the source is the sentence lowercased, without punctuation)",
}


def dataset_description(options) -> tuple[str, str]:
    """(model-index dataset type, prose)."""
    data = options.data
    if data.dataset_name == "stdlib_docstrings":
        return "stdlib_docstrings", f"Built in: {STDLIB_TASKS[corpus_config(options)]} (`hf_outheads/training/corpora/stdlib.py`)."
    if data.dataset_name in BUILT_CORPORA:  # built on the machine from Debian packages: its module says what it is
        module = sys.modules[BUILT_CORPORA[data.dataset_name][0].__module__]
        summary = " ".join(module.__doc__.split("\n\n")[0].split())
        return data.dataset_name, f"Built on the machine by `{module.__name__}`, config `{corpus_config(options)}`: {summary}"
    if data.dataset_name:
        config = f" (`{data.dataset_config}`)" if data.dataset_config else ""
        return data.dataset_name, f"The Hub dataset `{data.dataset_name}`{config}, split `{data.train_split}`."
    return "local", f"Local files: `{data.data_files}`."


def run_sections(model, tokenizer, options, results, output_dir: Path, data_prose: str) -> dict[str, str]:
    """The run's sections of the card: data, procedure (and the training curve), evaluation
    results and sample, and the head's papers with BibTeX (the head class's `papers`)."""
    text = model.config.text_config
    backbone = (f"converted from `{options.model.pretrained}` with `from_backbone`" if options.model.pretrained
                else f"the `{options.model.model_preset}` preset (`{text.model_type}`), randomly initialised")
    sections = {"Training data": f"{data_prose}\n\nBackbone: {backbone}. Tokenizer: {options.model.tokenizer} "
                                 f"({len(tokenizer):,} tokens)."}
    rows = "".join(f"| {key} | {value} |\n" for key, value in hyperparameters(options).items())
    curve = "\n![training curve](training_curve.png)\n" if (output_dir / CURVE_FILE).exists() else ""
    sections["Training procedure"] = f"| hyperparameter | value |\n| --- | --- |\n{rows}{resumed(output_dir)}{curve}"
    table = "".join(f"| {name} | {results[key]:.4g} |\n" for key, (_, name) in CARD_METRICS.items() if key in results)
    sample = results.get("sample") or (results.get("samples") or [{}])[0].get("prediction")
    sections["Evaluation results"] = (
        f"On the `{options.data.validation_split}` split ({results.get('eval_examples')} examples, "
        f"{results.get('eval_tokens')} tokens):\n\n| metric | value |\n| --- | --- |\n{table}"
        + (f"\nA generated sample:\n\n```text\n{sample}\n```\n" if sample else ""))
    citation = citation_section(model.config.head_class)
    if citation:
        sections["Citation"] = citation
    return sections


def resumed(output_dir: Path) -> str:
    """The run's history: each resumption that changed the run's length (metrics.jsonl's `resume` events,
    `run.resume_or_start_fresh`), as lines below the hyperparameters, which state the final values."""
    lines = [f"Resumed at step {record['step']} with "
             + ", ".join(f"{name} {json.dumps(new)} (trained until then with {json.dumps(old)})"
                         for name, (old, new) in record["changed"].items()) + "."
             for record in read_metrics(output_dir) if record.get("event") == "resume"]
    return "".join(f"\n{line}\n" for line in lines)


def render_card(model, tokenizer, options, results, output_dir: Path, repo_id: str | None = None) -> ModelCard:
    """The model card of `hf_outheads.tools.model_card.build_model_card` (its tags and `base_model`
    rule: never a local path) with the run's sections, the results as its model-index, and
    usage code that generates the card's sample again, loading `repo_id` (the Hub repository the run is
    pushed to; default: output_dir's absolute path); no network (no validate())."""
    dataset_type, data_prose = dataset_description(options)
    data, training = options.data, options.training
    auto_class = "AutoModelForCausalLM" if options.model.task == "causal_lm" else "AutoModelForSeq2SeqLM"
    task_type = pipeline_tag(auto_class)
    evals = [
        EvalResult(task_type=task_type, dataset_type=dataset_type, dataset_name=dataset_type,
                   dataset_config=corpus_config(options) if data.dataset_name in BUILT_CORPORA else data.dataset_config,
                   dataset_split=data.validation_split,
                   metric_type=metric_type, metric_name=name, metric_value=round(float(results[key]), 4))
        for key, (metric_type, name) in CARD_METRICS.items() if key in results
    ]
    repo_id = repo_id or str(output_dir.resolve())  # a path works from any folder; as given it would be a Hub id
    return build_model_card(
        model, repo_id, usage=usage_code(options, results, auto_class, repo_id),
        sections=run_sections(model, tokenizer, options, results, output_dir, data_prose),
        model_name=Path(training.hub_model_id or training.output_dir).name, license=training.license,
        datasets=[data.dataset_name] if data.dataset_name and data.dataset_name != "stdlib_docstrings" else None,
        eval_results=evals,
    )


def usage_code(options, results, auto_class: str, repo_id: str) -> str:
    """Code that generates the card's sample again: the causal LM's sample with its prompt,
    seed and sampling settings (`evaluation.sample_text`), the seq2seq example with the
    greedy or beam decoding of the evaluation (`evaluation.generate_texts`), source ended by eos."""
    if options.model.task == "causal_lm":
        text = json.dumps(results.get("sample_prompt") or (results.get("sample") or "The")[:30])
        settings = ", ".join(f"{key}={value!r}" for key, value in SAMPLING.items())
        new_tokens = results.get("sample_max_new_tokens", options.training.sample_max_new_tokens)
        call = (f"torch.manual_seed({options.training.seed})  # the card's sample is sampled: the same seed gives it again\n"
                f"output = model.generate(**inputs, max_new_tokens={new_tokens}, {settings})")
    else:
        text = json.dumps(results["samples"][0]["source"]) + " + tokenizer.eos_token" if results.get("samples") else '"..."'
        call = (f"output = model.generate(**inputs, max_new_tokens={options.data.max_target_length}, "
                f"num_beams={options.training.generation_num_beams}, do_sample=False)")
    return f"""import torch
import hf_outheads.configuration_outheads  # registers the outheads model type with the Auto classes
from transformers import {auto_class}, AutoTokenizer

model = {auto_class}.from_pretrained("{repo_id}")
tokenizer = AutoTokenizer.from_pretrained("{repo_id}")
inputs = tokenizer({text}, return_tensors="pt", add_special_tokens=False)
{call}
print(tokenizer.decode(output[0], skip_special_tokens=True))"""


def hub_repo(training) -> str:
    """The Hub repository a run is pushed to, made now (kept when it exists): `hub_model_id`, or the
    output folder's name in the user's namespace; its id as the Hub gives it back (`namespace/name`),
    which the card's usage code loads."""
    return HfApi().create_repo(repo_name(training), private=training.hub_private, exist_ok=True).repo_id


def repo_name(training) -> str:
    """The repository a run is pushed to, as the run names it: `hub_model_id`, or the output folder's name."""
    return training.hub_model_id or Path(training.output_dir).resolve().name


def push_to_hub(model, tokenizer, output_dir: Path, repo_id: str) -> str:
    """Model and tokenizer first (model.push_to_hub writes its own README.md), then the
    plot, the results and, last, our model card over that README, to the repository `repo_id`
    (`hub_repo`)."""
    api = HfApi()
    model.push_to_hub(repo_id, commit_message="Upload model")
    tokenizer.push_to_hub(repo_id, commit_message="Upload tokenizer")
    for name in (CURVE_FILE, RESULTS_FILE, "README.md"):
        if (output_dir / name).exists():
            api.upload_file(path_or_fileobj=str(output_dir / name), path_in_repo=name, repo_id=repo_id,
                            commit_message=f"Upload {name}")
    return repo_id


class PushFailed(RuntimeError):
    """A push to the Hub failed after the run's folder was written whole: says so and how to upload it later."""


def save_card(card: ModelCard, output_dir: Path) -> None:
    """Write the card as output_dir/README.md, whole or not at all."""
    part = output_dir / "README.md.part"
    card.save(part)
    os.replace(part, output_dir / "README.md")


def finish_run(model, tokenizer, options, results, state_dict=None) -> Path:
    """Everything a run leaves in output_dir: the training curve, then the model, tokenizer, results,
    options and card written beside it and moved in once all are written, `config.json` last
    (`hf_outheads.tools.folders.save_then_swap`; what a finish killed before left there is removed first), so that
    a run killed while it finishes leaves no folder that looks finished (the same command resumes it). Prints
    where the card is; then pushes (`publish`). `state_dict`: the full weights (`accelerator.get_state_dict`,
    needed when the model is sharded); None: the model's. A `use_peft` run's model is PEFT's: its adapter
    is written to output_dir/adapter and its merged model is the one saved (`lora.merged_and_adapter`)."""
    output_dir = Path(options.training.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    for stale in output_dir.glob(f"{SAVING_PREFIX}*"):  # the run holds the folder's lock: no other save is under way
        shutil.rmtree(stale, ignore_errors=True)
    plot_training_curve(output_dir)
    adapter = None
    if options.model.use_peft:  # `model` is PEFT's: the adapter saved, then the merged model is the run's model
        shutil.rmtree(output_dir / ADAPTER_FOLDER, ignore_errors=True)  # an earlier run's, replaced (overwrite_output_dir)
        model, adapter = merged_and_adapter(model, output_dir)

    def write(folder):
        folder = Path(folder)
        if adapter is not None:
            move_adapter(adapter, folder)
        model.save_pretrained(folder, state_dict=state_dict)
        tokenizer.save_pretrained(folder)
        (folder / RESULTS_FILE).write_text(json.dumps(results, indent=2) + "\n")
        (folder / CONFIG_FILE).write_text(yaml.safe_dump(saved_options(options), sort_keys=False))
        # the card as it will be pushed (`hf upload` later) when the repository is named, else loading the folder
        render_card(model, tokenizer, options, results, output_dir, options.training.hub_model_id).save(
            folder / "README.md")

    save_then_swap(write, output_dir, replaced=package_code_files(type(model)))
    print(summary(options, results, output_dir))
    if options.training.push_to_hub:
        publish(model, tokenizer, options, results, output_dir)
    return output_dir / "README.md"


def publish(model, tokenizer, options, results, output_dir: Path) -> str:
    """Push the finished folder to its Hub repository (`hub_repo`), its card rendered again first when the Hub
    names the repository otherwise than the local card does (a name without namespace); a failure of the
    Hub is a `PushFailed` saying that the folder is complete and the command that uploads it later."""
    training = options.training
    repo_id = repo_name(training)
    try:
        repo_id = hub_repo(training)
        if repo_id != training.hub_model_id:
            save_card(render_card(model, tokenizer, options, results, output_dir, repo_id), output_dir)
        push_to_hub(model, tokenizer, output_dir, repo_id)
    except Exception as error:  # noqa: BLE001: any failure of the Hub or the network
        lines = str(error).splitlines()
        raise PushFailed(f"The push to the Hub failed ({type(error).__name__}: {lines[0] if lines else ''}): "
                         f"{output_dir.resolve()} is complete (model, tokenizer, card); upload it later with "
                         f"`hf upload {repo_id} {output_dir.resolve()} --exclude 'checkpoints/*'`.") from None
    print(f"Pushed to https://huggingface.co/{repo_id}")
    return repo_id


def summary(options, results, output_dir: Path) -> str:
    lines = [f"validation perplexity: {results['eval_perplexity']:.2f} "
             f"({results['eval_examples']} examples, {results['eval_tokens']} tokens)"]
    for key, (_, name) in CARD_METRICS.items():
        if key in results and key not in ("eval_perplexity", "eval_loss"):
            lines.append(f"{name}: {results[key]:.2f}")
    if results.get("sample"):
        lines.append(f"sample: {results['sample']!r}")
    for sample in results.get("samples", [])[:3]:
        lines.append(f"source: {sample['source']!r}\n  generated: {sample['prediction']!r}\n  reference: {sample['reference']!r}")
    lines.append(f"model card: {output_dir / 'README.md'}")
    return "\n".join(lines)
