"""Every training option, its default and its help text, in one dataclass.

Options come from a YAML file (`--config`) and are overridden by `--key value` flags
(`--key-value` too, as `HfArgumentParser` accepts). An unknown key in either place is an error
that lists the valid keys. Values of non-string options given on the command line are parsed as
YAML (`--head_options '{k: 4}'`, `--gradient_checkpointing true`, `--generation_metrics
'[sacrebleu, chrf]'`). Each field declares its type, and a numeric one its range (`spec`, the
`Spec` head options declare theirs with); everything is checked when parsed (`check_values`),
and a file or value that is not YAML is named in one line.

Hand-written rather than transformers' `HfArgumentParser`: that parser turns a `dict` field's
flag into `dict(string)` and a `list` field into `nargs="+"` strings, and reads no `null`, so
`--head_options '{k: 4}'` or `--max_steps null` (YAML values on the command line) cannot be given.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from transformers import SchedulerType

from hf_outheads import HEAD_CLASSES, HeadOptions, get_head_class
from hf_outheads.head_options import Spec

from .command_line import CommandParser


def opt(default: Any, help: str, choices: tuple | None = None, spec: Spec | None = None):
    """A field: its default, help text, and the values it takes (`choices`, or a numeric `spec`;
    None is accepted where the field's type allows it)."""
    factory = (lambda: type(default)(default)) if isinstance(default, (dict, list)) else None
    metadata = {"help": help, "choices": choices, "spec": spec}
    return field(default_factory=factory, metadata=metadata) if factory else field(default=default, metadata=metadata)


def at_least(low: int) -> Spec:
    return Spec("int", low=low)


POSITIVE = Spec("number", low=0.0, open_low=True)
RATE = Spec("number", low=0.0, high=1.0, open_high=True)  # a dropout probability, an Adam beta


@dataclass
class TrainOptions:
    # model
    task: str = opt("causal_lm", "What to train: a decoder-only LM or an encoder-decoder.", ("causal_lm", "seq2seq"))
    model_preset: str | None = opt(None, "Train a backbone from scratch from a named size preset (see training/modeling.py).")
    pretrained: str | None = opt(None, "Hub id or local path of a pretrained LM to convert with from_backbone (instead of a preset).")
    model_overrides: dict = opt({}, "Backbone config fields to override, e.g. {n_layer: 4} (presets and pretrained).")
    dropout: float | None = opt(None, "Set every dropout probability of the backbone to this value (0 for exact resumption).",
                                 spec=RATE)
    head_type: str | None = opt("tied", "Output head (a key of hf_outheads.HEAD_CLASSES); null keeps a pretrained model's head form.")
    head_options: dict = opt({}, "The head's hyper-parameters; omitted ones take the head's defaults (hf_outheads, "
                             "chosen by measurement: studies/results/ablations_*.md).")
    head_options_by_head: dict = opt({}, "Options per head type, {head_type: {option: value}}, used for the chosen head "
                                     "under head_options (lets compare_heads.py run several heads from one file).")
    # data
    dataset_name: str | None = opt(None, "Hub dataset (e.g. wikitext, ptb_text_only, iwslt2017, wmt14), 'stdlib_docstrings' (built in, offline) or 'debian_manpages' (built from Debian's manpages packages).")
    dataset_config: str | None = opt(None, "Dataset config, e.g. wikitext-2-raw-v1, iwslt2017-de-en, de-en; 'text', 'summary', 'restore' or 'restore_short' for stdlib_docstrings.")
    data_files: dict = opt({}, "Local files per split, e.g. {train: a.txt, validation: b.txt}; format from the extension (txt/json/jsonl/csv/parquet).")
    streaming: bool = opt(False, "Stream the dataset instead of downloading/preparing it whole (needs max_steps).")
    train_split: str = opt("train", "Split to train on.")
    validation_split: str = opt("validation", "Split to evaluate on; if the dataset lacks it, validation_percent of train is held out.")
    validation_percent: int = opt(5, "Share of the training split held out when there is no validation split.",
                                  spec=Spec("int", low=1, high=99))
    text_column: str = opt("text", "Text column for causal LM.")
    source_column: str = opt("source", "Source column for seq2seq (ignored when source_lang is set).")
    target_column: str = opt("target", "Target column for seq2seq (ignored when target_lang is set).")
    source_lang: str | None = opt(None, "For translation datasets: source language key inside the 'translation' column.")
    target_lang: str | None = opt(None, "For translation datasets: target language key inside the 'translation' column.")
    source_prefix: str = opt("", "Text prepended to every source, e.g. 'translate German to English: ' for T5.")
    block_size: int = opt(128, "Causal LM: tokens per training block (texts are concatenated and cut into blocks); "
                           "at most the model's positions.", spec=at_least(2))
    max_source_length: int = opt(128, "Seq2seq: source tokens kept.", spec=at_least(2))
    max_target_length: int = opt(64, "Seq2seq: target tokens kept (also the generation limit).", spec=at_least(1))
    max_train_samples: int | None = opt(None, "Keep only this many training examples (after loading, before tokenising).",
                                         spec=at_least(1))
    max_eval_samples: int | None = opt(None, "Keep only this many evaluation examples.", spec=at_least(1))
    preprocessing_num_workers: int | None = opt(None, "Processes for dataset.map (not used when streaming).",
                                                 spec=at_least(1))
    dataloader_num_workers: int = opt(0, "Worker processes that collate the training and evaluation batches while the "
                                      "model computes (0: the main process), kept across epochs; batches are pinned on a GPU and "
                                      "copied to it without waiting.", spec=at_least(0))
    # tokenizer
    tokenizer: str = opt("auto", "'auto' (the pretrained model's), 'bpe' or 'wordlevel' (trained on the training split), or a Hub id/path.")
    tokenizer_vocab_size: int = opt(8000, "Vocabulary (BPE code-dictionary) size of a trained tokenizer, special tokens "
                                    "included.", spec=at_least(5))
    tokenizer_min_frequency: int = opt(2, "Minimum count of a merge / word for a trained tokenizer.", spec=at_least(0))
    tokenizer_lowercase: bool = opt(False, "Lowercase text in a trained tokenizer.")
    # optimisation
    seed: int = opt(42, "Seed for initialisation, data order and dropout.", spec=at_least(0))
    per_device_train_batch_size: int = opt(16, "Training batch size per process.", spec=at_least(1))
    per_device_eval_batch_size: int = opt(32, "Evaluation batch size per process.", spec=at_least(1))
    learning_rate: float = opt(5e-4, "Peak learning rate of AdamW.", spec=POSITIVE)
    head_learning_rate: float | None = opt(None, "Peak learning rate of the output head's own parameters "
                                           "(not the shared embedding E); null: learning_rate.", spec=POSITIVE)
    weight_decay: float = opt(0.01, "AdamW weight decay (not applied to biases and norms).", spec=Spec("number", low=0.0))
    adam_beta1: float = opt(0.9, "AdamW beta1.", spec=RATE)
    adam_beta2: float = opt(0.999, "AdamW beta2.", spec=RATE)
    lr_scheduler_type: str = opt("linear", "Schedule after warmup (transformers.get_scheduler).",
                                  tuple(kind.value for kind in SchedulerType))
    warmup_steps: int = opt(0, "Linear warmup steps.", spec=at_least(0))
    num_train_epochs: float | None = opt(1.0, "Epochs to train when max_steps is not set.", spec=POSITIVE)
    max_steps: int | None = opt(None, "Total optimizer steps (overrides num_train_epochs).", spec=at_least(1))
    stop_after_steps: int | None = opt(None, "Stop after this many optimizer steps in total, as if interrupted (for resumption tests); "
                                        "only a run that starts below it stops, so rerunning finishes.", spec=at_least(1))
    gradient_accumulation_steps: int = opt(1, "Micro-batches accumulated per optimizer step.", spec=at_least(1))
    max_grad_norm: float | None = opt(1.0, "Gradient clipping norm; null disables.", spec=POSITIVE)
    mixed_precision: str = opt("no", "Mixed precision for accelerate ('bf16' works on CPU; fp16 needs a GPU).", ("no", "bf16", "fp16"))
    gradient_checkpointing: bool = opt(False, "Recompute activations in the backward pass to save memory.")
    torch_compile: bool = opt(False, "Compile the model with torch.compile (inductor; on a CPU it needs a C++ compiler): "
                              "the backbone's and the head's layers fused, the head's fused losses eager; each epoch's last, "
                              "shorter training batch is dropped, so that the step compiles once. Not with FSDP or DeepSpeed.")
    code_reassign_steps: int | None = opt(None, "Heads that update themselves periodically (updates_periodically: lightrnn "
                                          "re-assigns its word-code table): every this many optimizer steps (default: eval_steps; 0: never, a fixed table).",
                                          spec=at_least(0))
    # evaluation
    eval_steps: int | None = opt(None, "Evaluate every this many optimizer steps (and always at the end).", spec=at_least(0))
    generation_metrics: list = opt([], "Generation metrics from training/metrics: sacrebleu, chrf, rouge (seq2seq).")
    num_generation_examples: int | None = opt(None, "Evaluation examples used for generation metrics (null: all).",
                                               spec=at_least(1))
    generation_num_beams: int = opt(1, "Beams for generation-based evaluation.", spec=at_least(1))
    sample_prompt: str | None = opt(None, "Causal LM: prompt of the sample generated at the end (default: start of a validation text).")
    sample_max_new_tokens: int = opt(40, "Causal LM: tokens of the generated sample.", spec=at_least(1))
    # logging, checkpoints, publishing
    output_dir: str = opt("outputs/run", "Folder for the model, tokenizer, card, metrics.jsonl and checkpoints/.")
    overwrite_output_dir: bool = opt(False, "Let the run write into an output_dir that holds a finished model or files "
                                     "of no run (refused otherwise, as transformers' Trainer does).")
    logging_steps: int = opt(10, "Log the training loss every this many optimizer steps.", spec=at_least(1))
    save_steps: int | None = opt(None, "Save an accelerate checkpoint every this many optimizer steps.", spec=at_least(0))
    save_total_limit: int | None = opt(2, "Checkpoints kept, the one just saved among them (the oldest deleted); null: "
                                        "keep every one (transformers' TrainingArguments).", spec=at_least(1))
    resume: str = opt("auto", "'auto' resumes from the latest checkpoint in output_dir/checkpoints, 'never', or a checkpoint path.")
    report_to: str = opt("auto", "'auto' (JSONL, plus TensorBoard when installed), 'jsonl' or 'tensorboard'.", ("auto", "jsonl", "tensorboard"))
    push_to_hub: bool = opt(False, "Publish model, tokenizer and card to the Hub at the end.")
    hub_model_id: str | None = opt(None, "Repository for push_to_hub, e.g. user/gpt2-drill-wikitext2 (default: output_dir's name).")
    hub_private: bool = opt(False, "Create the Hub repository as private.")
    license: str = opt("apache-2.0", "License written in the model card.")

    def head_spec(self, name: str | None = None) -> HeadSpec:
        """The head of the run called `name` (default: `head_type`) under these options
        (`head_spec`), built and checked once per name: later calls return the same object while
        the options it comes from are unchanged. `head_type: null` (a pretrained model keeps its
        head as it is) needs `pretrained` and takes no head options."""
        key = (name, self.head_type, self.pretrained, json.dumps([self.head_options, self.head_options_by_head],
                                                                 sort_keys=True, default=str))
        built = self.__dict__.setdefault("_head_specs", {})  # not a field: never written to a config
        if key not in built:
            built[key] = self._build_head_spec(name)
        return built[key]

    def _build_head_spec(self, name: str | None) -> HeadSpec:
        if name is None and self.head_type is None:
            if not self.pretrained:
                raise ValueError("Option head_type: null (keep the pretrained head) needs pretrained; "
                                 f"choose one of {sorted(HEAD_CLASSES)}.")
            if self.head_options:
                raise ValueError(f"Option head_options={self.head_options!r} needs a head_type: with head_type: null "
                                 "the pretrained model keeps its head as it is.")
            return HeadSpec(None, None)
        return head_spec(self.head_type if name is None else name, self.head_options_by_head, self.head_options)


@dataclass(frozen=True)
class HeadSpec:
    """A run's head: its type and the options given for it, as the head's options object, checked
    against the head's declarations when built (`HeadOptions.from_dict`); None when none was given.
    Fields left unset take the head's defaults when the model is built, those for a conversion
    when it converts a pretrained model. Built by `head_spec`; the model is built from this object
    (`OutHeadsConfig(head_options=...)`, `from_backbone(head_options=...)`), not from a dict."""

    head_type: str | None
    options: HeadOptions | None

    def spelt_out(self) -> dict:
        """Every option: the given ones, and the head's current defaults (None where a default is
        decided when the model is built) for the others."""
        return dataclasses.asdict(self.options or get_head_class(self.head_type).Options())


def head_spec(name: str, head_options_by_head: dict, head_options: dict | None = None) -> HeadSpec:
    """The one rule from a run name to its head (train.py, compare_heads.py, scale_heads.py, the
    benchmarks and the tests use it): `name` is a head type, or a key of `head_options_by_head`
    whose entry names its head with `head_type` (a variant, e.g. `mos-paper: {head_type: mos,
    latent_init: uniform}`); its options are that entry's under `head_options`, checked against the
    head's declarations now (`HeadOptions.from_dict`); what depends on the backbone's sizes is
    checked when the model is built. A ValueError names the problem."""
    entry = head_options_by_head.get(name, {})
    if not isinstance(entry, dict):
        raise ValueError(f"Option head_options_by_head[{name!r}] must be a mapping of option: value, got {entry!r}.")
    entry = dict(entry)
    head_type, given = entry.pop("head_type", name), {**entry, **(head_options or {})}
    try:
        options_class = get_head_class(head_type).Options
    except ValueError as error:
        hint = " A variant (a key of head_options_by_head) names its head with `head_type`." \
            if name == head_type and name in head_options_by_head else ""
        raise ValueError(f"{error}{hint}") from None
    return HeadSpec(head_type, options_class.from_dict(given) if given else None)


FIELDS = {f.name: f for f in dataclasses.fields(TrainOptions)}
STRING_FIELDS = {name for name, f in FIELDS.items() if f.type in ("str", "str | None")}
CONFIG_FILE = "train_config.yaml"  # a run's options, saved beside its model (`saved_options`)


def saved_options(options: TrainOptions) -> dict:
    """The options that make a run what it is, as `--config` reads them (the file `CONFIG_FILE`):
    every field but `overwrite_output_dir`, which says how one command treats its folder."""
    return {name: getattr(options, name) for name in FIELDS if name != "overwrite_output_dir"}


def unknown_keys_error(keys, where: str) -> ValueError:
    return ValueError(f"Unknown option(s) {sorted(keys)} in {where}. Valid options: {', '.join(FIELDS)}.")


SHIPPED_CONFIGS = Path(__file__).resolve().parent / "configs"  # training/configs, installed as hf_outheads/training/configs


def config_path(given: str) -> Path:
    """`--config` as given; where no such file exists, `training/configs/<name>` (as the READMEs write
    it) is the config shipped with the package, so the documented commands run from any folder."""
    path = Path(given)
    if not path.exists() and path.parts[:-1] == ("training", "configs") and (SHIPPED_CONFIGS / path.name).is_file():
        return SHIPPED_CONFIGS / path.name
    if not path.is_file():
        raise ValueError(f"--config {given}: no such file. The shipped configs are training/configs/"
                         f"{{{','.join(sorted(p.name for p in SHIPPED_CONFIGS.glob('*.yaml')))}}}.")
    return path


def yaml_value(text: str, where: str):
    """`text` read as YAML; a ValueError naming `where` and the YAML problem, in one line."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(error, "problem", None) or str(error).splitlines()[0]
        problem += " (YAML indents with spaces, not tabs)" if "'\\t'" in problem else ""
        raise ValueError(f"{where} is not valid YAML: {problem}{at}.") from None


def load_yaml(path: str) -> dict:
    path = config_path(path)
    values = yaml_value(path.read_text(), f"--config {path}") or {}
    if not isinstance(values, dict):
        raise ValueError(f"{path} must hold a mapping of option: value.")
    unknown = set(values) - set(FIELDS)
    if unknown:
        raise unknown_keys_error(unknown, path)
    return values


def build_parser(description: str) -> argparse.ArgumentParser:
    parser = CommandParser(description=description)
    parser.add_argument("--config", help="YAML file of options; flags given here override it.")
    for name, f in FIELDS.items():
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        text = f.metadata["help"] if "default" in f.metadata["help"] else f"{f.metadata['help']} (default: {default!r})"
        flag = {"nargs": "?", "const": "true"} if f.type == "bool" else {}  # `--flag` alone is true, as in HfArgumentParser
        parser.add_argument(f"--{name}", default=argparse.SUPPRESS, help=text, **flag)
    return parser


BYTE_ALPHABET = 256 + 4  # a byte-level BPE holds every byte plus <pad> <s> </s> <unk>


def check_ranges(options: TrainOptions) -> None:
    """Every numeric option in its declared range (`spec`; None where the type allows it), a number
    of steps, and the tokenizer's size, before any work starts."""
    for name, f in FIELDS.items():
        spec, value = f.metadata["spec"], getattr(options, name)
        if spec is None or value is None and f.type.endswith("| None"):
            continue
        if not spec.accepts(value):
            raise ValueError(f"Option {name} must be {spec.describe()}, got {value!r}.")
    if options.max_steps is None and (options.streaming or options.num_train_epochs is None):
        raise ValueError("Set max_steps: " + ("a streamed dataset has no length." if options.streaming else
                                              "num_train_epochs is null."))
    if options.tokenizer == "bpe" and options.tokenizer_vocab_size < BYTE_ALPHABET:
        raise ValueError(f"Option tokenizer_vocab_size={options.tokenizer_vocab_size} is below the byte-level BPE "
                         f"alphabet: use at least {BYTE_ALPHABET} (256 bytes + 4 special tokens).")


def check_values(options: TrainOptions) -> TrainOptions:
    for name, f in FIELDS.items():
        if f.type.startswith("float") and isinstance(getattr(options, name), (str, int)):  # YAML reads 1e-3 as a string
            try:
                setattr(options, name, float(getattr(options, name)))
            except ValueError:
                raise ValueError(f"Option {name} must be a number, got {getattr(options, name)!r}.") from None
        value, choices = getattr(options, name), f.metadata["choices"]
        if choices and value not in choices:
            raise ValueError(f"Option {name}={value!r} is not one of {list(choices)}.")
        for kind in (dict, list, bool):
            if kind.__name__ == f.type and not isinstance(value, kind):
                raise ValueError(f"Option {name} must be a {kind.__name__}, got {value!r}.")
        if name in STRING_FIELDS and not isinstance(value, str) and not (value is None and f.type.endswith("| None")):
            raise ValueError(f"Option {name} must be a string, got {value!r}.")
    check_ranges(options)
    options.head_spec()
    return options


def command_line_backbone(values: dict, flags: dict) -> None:
    """A backbone given on the command line takes the place of the config file's: `--pretrained`
    replaces its `model_preset`, and its trained tokenizer (`bpe` / `wordlevel`, which cannot fit
    a pretrained model's embeddings) by the pretrained model's own (`auto`) unless `--tokenizer`
    is given too; `--model_preset` replaces its `pretrained`."""
    for given, other in (("pretrained", "model_preset"), ("model_preset", "pretrained")):
        if values.get(given) and given in flags and other not in flags:
            values[other] = None
    if values.get("pretrained") and "pretrained" in flags and "tokenizer" not in flags \
            and values.get("tokenizer") in ("bpe", "wordlevel"):
        values["tokenizer"] = "auto"


def parse_options(argv=None, description: str = "Train an hf_outheads model.", extra=None) -> TrainOptions:
    """Options from `--config` and `--key value` flags. `extra(parser)` may add script flags,
    which are returned in `options.extra` (a dict)."""
    parser = build_parser(description)
    if extra:
        extra(parser)
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        parser.error(str(unknown_keys_error([u for u in unknown if u.startswith("--")] or unknown, "the command line")))
    flags = vars(args)
    values = load_yaml(flags.pop("config")) if flags.get("config") else {}
    flags.pop("config", None)
    extras = {key: flags.pop(key) for key in list(flags) if key not in FIELDS}
    for name, raw in flags.items():
        values[name] = raw if name in STRING_FIELDS or not isinstance(raw, str) else yaml_value(raw, f"--{name} {raw}")
        if name in STRING_FIELDS and raw in ("null", "None"):
            values[name] = None
    command_line_backbone(values, flags)
    options = check_values(TrainOptions(**values))
    options.extra = extras
    return options
