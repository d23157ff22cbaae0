"""A training run's options: three groups of declared fields, as TRL's `ScriptArguments` /
`ModelConfig` / `SFTConfig` are: `ModelOptions` (backbone, head, tokenizer), `DataOptions`
(dataset, splits, lengths) and `TrainingOptions` (optimisation, evaluation, the run's folder and
publishing), held by one `RunOptions` and read as `options.data.block_size`.

Every field is declared with `hf_outheads.head_options`' declarators, as head options are: its
type, its range or choices and its help text, in one place. Building an options object checks
every field against its declaration (`Spec.check`), whichever way the values came: a YAML file
(`--config`, one flat mapping of option: value), `--key value` flags (the parser is built from the
declarations, one argument group per options group: `declared_flags.add_declared`), or Python
(`RunOptions.from_flat`). An unknown key in either place is an error that lists the valid keys,
and a file or value that is not YAML is named in one line. The run's head is decided once, when
the model options are built (`ModelOptions.head`): its class looked up, its options object built
and checked; the model is built from that object.

Hand-written rather than transformers' `HfArgumentParser`: that parser turns a `dict` field's
flag into `dict(string)` and a `list` field into `nargs="+"` strings, and reads no `null`, so
`--head_options '{k: 4}'` or `--max_steps null` (YAML values on the command line) cannot be given.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

import hf_outheads  # its heads are imported when first used: building the parser needs no torch
from hf_outheads.head_options import (DeclaredOptions, HeadOptions, choice, flag, integer, listing, mapping, number,
                                      probability, text)

from hf_outheads.tools.command_line import CommandParser
from hf_outheads.training.declared_flags import add_declared, declared_values, yaml_value
from hf_outheads.training.tracking import report_to_names

CONFIG_FILE = "train_config.yaml"  # a run's options, saved beside its model (`saved_options`)
BYTE_ALPHABET = 256 + 4  # a byte-level BPE holds every byte plus <pad> <s> </s> <unk>
# transformers' `SchedulerType` values, written out because importing it imports torch, which `--help` does not
# need (tests/test_commands.py checks that they agree)
SCHEDULER_TYPES = ("linear", "cosine", "cosine_with_restarts", "polynomial", "constant", "constant_with_warmup",
                   "inverse_sqrt", "reduce_lr_on_plateau", "cosine_with_min_lr", "cosine_warmup_with_min_lr",
                   "warmup_stable_decay", "greedy")


@dataclass(frozen=True)
class HeadSpec:
    """A run's head: the head's options object, built from the options given for it and checked
    against the head's declarations (`HeadOptions.from_dict`), which names its head (`head_type`,
    `head_class`); None: a pretrained model keeps its head as it is. Fields left unset take the
    head's defaults when the model is built, those for a conversion when it converts a pretrained
    model. Built by `head_spec`, the one lookup of the head class; the model is built from this
    object (`OutHeadsConfig(head_options=...)`, `from_backbone(head_options=...)`), not from a
    name or a dict."""

    options: HeadOptions | None

    @property
    def head_type(self) -> str | None:
        return self.options.head_type if self.options is not None else None

    @property
    def head_class(self) -> type | None:
        return self.options.head_class if self.options is not None else None

    def spelt_out(self) -> dict:
        """Every option: the given ones, and the head's current defaults (None where a default is
        decided when the model is built) for the others; `{}` when the pretrained head is kept."""
        return dataclasses.asdict(self.options) if self.options is not None else {}


def head_spec(name: str, head_options_by_head: dict, head_options: dict | None = None) -> HeadSpec:
    """The one rule from a run name to its head (train.py, compare_heads.py, scale_heads.py, the
    benchmarks and the tests use it): `name` is a head type, or a key of `head_options_by_head`
    whose entry names its head with `head_type` (a variant, e.g. `mos-paper: {head_type: mos,
    latent_init: uniform}`); its options are that entry's under `head_options`, checked against the
    head's declarations now (`HeadOptions.from_dict`), in the head's options object, which the
    model is built from; what depends on the backbone's sizes is checked when the model is built.
    A ValueError names the problem."""
    entry = head_options_by_head.get(name, {})
    if not isinstance(entry, dict):
        raise ValueError(f"Option head_options_by_head[{name!r}] must be a mapping of option: value, got {entry!r}.")
    entry = dict(entry)
    head_type, given = entry.pop("head_type", name), {**entry, **(head_options or {})}
    try:
        options_class = hf_outheads.get_head_class(head_type).Options
    except ValueError as error:
        hint = " A variant (a key of head_options_by_head) names its head with `head_type`." \
            if name == head_type and name in head_options_by_head else ""
        raise ValueError(f"{error}{hint}") from None
    return HeadSpec(options_class.from_dict(given))


@dataclass(frozen=True)
class ModelOptions(DeclaredOptions):
    """The backbone, its output head and its tokenizer."""

    task: str = choice("causal_lm", ("causal_lm", "seq2seq"), help=(
        "What to train: a decoder-only LM or an encoder-decoder."))
    model_preset: str | None = text(None, optional=True, help=(
        "Train a backbone from scratch from a named size preset (see hf_outheads/training/modeling.py)."))
    pretrained: str | None = text(None, optional=True, help=(
        "Hub id or local path of a pretrained LM to convert with from_backbone (instead of a preset)."))
    model_overrides: dict = mapping(dict, help=(
        "Backbone config fields to override, e.g. {n_layer: 4} (presets and pretrained)."))
    dropout: float | None = number(None, 0.0, 1.0, open_high=True, optional=True, help=(
        "Set every dropout probability of the backbone to this value (0 for exact resumption)."))
    head_type: str | None = text("tied", optional=True, help=(
        "Output head (a key of hf_outheads.HEAD_CLASSES); null keeps a pretrained model's head form."))
    head_options: dict = mapping(dict, help=(
        "The head's hyper-parameters; omitted ones take the head's defaults (hf_outheads, chosen by measurement: "
        "studies/results/ablations_*.md)."))
    head_options_by_head: dict = mapping(dict, help=(
        "Options per head type, {head_type: {option: value}}, used for the chosen head under head_options (lets "
        "compare_heads.py run several heads from one file)."))
    trainable_modules: list = listing(list, help=(
        "Names of the model's modules that train, e.g. [head.predictors] (an mtp head's future-token predictors); "
        "every other parameter is frozen, and a frozen head is not given the training set's word counts. Empty: the "
        "whole model trains."))
    use_peft: bool = flag(False, help=(
        "Train LoRA adapters on the backbone through PEFT (TRL's use_peft); the head, new, trains fully. The run "
        "saves the merged model and the adapter (output_dir/adapter)."))
    lora_r: int = integer(16, 1, help="LoRA rank (TRL's lora_r, PEFT's r).")
    lora_alpha: int = integer(32, 1, help="LoRA scaling alpha (TRL's lora_alpha).")
    lora_dropout: float = number(0.05, 0.0, 1.0, open_high=True, help="Dropout of the LoRA layers (TRL's lora_dropout).")
    lora_target_modules: list = listing(list, help=(
        "Backbone modules that get adapters, by name, e.g. [q_proj, v_proj], or [all-linear] (TRL's "
        "lora_target_modules); empty: PEFT's default for the backbone's model type."))
    tokenizer: str = text("auto", help=(
        "'auto' (the pretrained model's), 'bpe' or 'wordlevel' (trained on the training split), or a Hub id/path."))
    tokenizer_vocab_size: int = integer(8000, 5, help=(
        "Vocabulary (BPE code-dictionary) size of a trained tokenizer, special tokens included."))
    tokenizer_min_frequency: int = integer(2, 0, help="Minimum count of a merge / word for a trained tokenizer.")
    tokenizer_lowercase: bool = flag(False, help="Lowercase text in a trained tokenizer.")

    def __post_init__(self):
        super().__post_init__()
        if self.tokenizer == "bpe" and self.tokenizer_vocab_size < BYTE_ALPHABET:
            raise ValueError(f"Option tokenizer_vocab_size={self.tokenizer_vocab_size} is below the byte-level BPE "
                             f"alphabet: use at least {BYTE_ALPHABET} (256 bytes + 4 special tokens).")
        if self.use_peft and self.trainable_modules:
            raise ValueError(f"Options use_peft and trainable_modules={self.trainable_modules} exclude each other: LoRA "
                             "trains the adapters and the head; drop one of them.")
        # `head` (no option, never saved): the run's head, decided and its options checked here, once
        object.__setattr__(self, "head", self.head_spec())

    def head_spec(self, name: str | None = None) -> HeadSpec:
        """The head of the run called `name` (default: `head_type`, the run's own, `self.head`) under these
        options (`head_spec`). `head_type: null` (a pretrained model keeps its head as it is) needs
        `pretrained` and takes no head options."""
        if name is None and self.head_type is None:
            if not self.pretrained:
                raise ValueError("Option head_type: null (keep the pretrained head) needs pretrained; "
                                 f"choose one of {sorted(hf_outheads.HEAD_CLASSES)}.")
            if self.head_options:
                raise ValueError(f"Option head_options={self.head_options!r} needs a head_type: with head_type: null "
                                 "the pretrained model keeps its head as it is.")
            return HeadSpec(None)
        return head_spec(self.head_type if name is None else name, self.head_options_by_head, self.head_options)


@dataclass(frozen=True)
class DataOptions(DeclaredOptions):
    """The dataset, its splits and columns, and the lengths it is cut to."""

    dataset_name: str | None = text(None, optional=True, help=(
        "Hub dataset (e.g. wikitext, ptb_text_only, iwslt2017, wmt14), 'stdlib_docstrings' (built in, offline) or "
        "'debian_manpages' (built from Debian's manpages packages)."))
    dataset_config: str | None = text(None, optional=True, help=(
        "Dataset config, e.g. wikitext-2-raw-v1, iwslt2017-de-en, de-en; 'text', 'summary', 'restore' or "
        "'restore_short' for stdlib_docstrings."))
    data_files: dict = mapping(dict, help=(
        "Local files per split, e.g. {train: a.txt, validation: b.txt}; format from the extension "
        "(txt/json/jsonl/csv/parquet)."))
    streaming: bool = flag(False, help="Stream the dataset instead of downloading/preparing it whole (needs max_steps).")
    train_split: str = text("train", help="Split to train on.")
    validation_split: str = text("validation", help=(
        "Split to evaluate on; if the dataset lacks it, validation_percent of train is held out."))
    validation_percent: int = integer(5, 1, maximum=99, help=(
        "Share of the training split held out when there is no validation split."))
    text_column: str = text("text", help="Text column for causal LM.")
    source_column: str = text("source", help="Source column for seq2seq (ignored when source_lang is set).")
    target_column: str = text("target", help="Target column for seq2seq (ignored when target_lang is set).")
    source_lang: str | None = text(None, optional=True, help=(
        "For translation datasets: source language key inside the 'translation' column."))
    target_lang: str | None = text(None, optional=True, help=(
        "For translation datasets: target language key inside the 'translation' column."))
    source_prefix: str = text("", help="Text prepended to every source, e.g. 'translate German to English: ' for T5.")
    block_size: int = integer(128, 2, help=(
        "Causal LM: tokens per training block (texts are concatenated and cut into blocks); at most the model's "
        "positions."))
    max_source_length: int = integer(128, 2, help="Seq2seq: source tokens kept.")
    max_target_length: int = integer(64, 1, help="Seq2seq: target tokens kept (also the generation limit).")
    max_train_samples: int | None = integer(None, 1, optional=True, help=(
        "Keep only this many training examples (after loading, before tokenising)."))
    max_eval_samples: int | None = integer(None, 1, optional=True, help="Keep only this many evaluation examples.")
    preprocessing_num_workers: int | None = integer(None, 1, optional=True, help=(
        "Processes for dataset.map (not used when streaming)."))


@dataclass(frozen=True)
class TrainingOptions(DeclaredOptions):
    """Optimisation, evaluation, the run's folder, checkpoints and publishing."""

    seed: int = integer(42, 0, help="Seed for initialisation, data order and dropout.")
    per_device_train_batch_size: int = integer(16, 1, help="Training batch size per process.")
    per_device_eval_batch_size: int = integer(32, 1, help="Evaluation batch size per process.")
    data_seed: int | None = integer(None, 0, optional=True, help=(
        "Seed of the training data's order (null: seed), so that runs of other seeds can see the same batches."))
    dataloader_num_workers: int | None = integer(None, 0, optional=True, help=(
        "Worker processes that collate (and check) the training and evaluation batches while the model computes, "
        "kept across epochs (0: the main process; null: 4 when training on a GPU, 0 on a CPU, whose cores compute "
        "the step); batches are pinned on a GPU and copied to it without waiting."))
    learning_rate: float = number(5e-4, 0.0, open_low=True, help="Peak learning rate of AdamW.")
    head_learning_rate: float | None = number(None, 0.0, open_low=True, optional=True, help=(
        "Peak learning rate of the output head's own parameters (not the shared embedding E); null: learning_rate."))
    weight_decay: float = number(0.01, 0.0, help="AdamW weight decay (not applied to biases and norms).")
    adam_beta1: float = probability(0.9, help="AdamW beta1.")
    adam_beta2: float = probability(0.999, help="AdamW beta2.")
    lr_scheduler_type: str = choice("linear", SCHEDULER_TYPES, help=(
        "Schedule after warmup (transformers.get_scheduler)."))
    lr_scheduler_kwargs: dict = mapping(dict, help=(
        "Further arguments of the schedule, e.g. {min_lr_rate: 0.1} for cosine_with_min_lr (transformers.get_scheduler's "
        "scheduler_specific_kwargs)."))
    warmup_steps: int = integer(0, 0, help="Linear warmup steps.")
    num_train_epochs: float | None = number(1.0, 0.0, open_low=True, optional=True, help=(
        "Epochs to train when max_steps is not set."))
    max_steps: int | None = integer(None, 1, optional=True, help="Total optimizer steps (overrides num_train_epochs).")
    stop_after_steps: int | None = integer(None, 1, optional=True, help=(
        "Stop after this many optimizer steps in total, as if interrupted (for resumption tests); only a run that "
        "starts below it stops, so rerunning finishes."))
    gradient_accumulation_steps: int = integer(1, 1, help="Micro-batches accumulated per optimizer step.")
    max_grad_norm: float | None = number(1.0, 0.0, open_low=True, optional=True, help=(
        "Gradient clipping norm; null disables."))
    mixed_precision: str | None = choice(None, ("no", "bf16", "fp16"), optional=True, help=(
        "Mixed precision for accelerate ('bf16' works on CPU; fp16 needs a GPU); null: the launch's (`accelerate "
        "launch --mixed_precision`, or its accelerate config), else 'no'. Set here, it wins over the launch's, and a "
        "line says so; the run's record states the precision it trained with."))
    gradient_checkpointing: bool = flag(False, help="Recompute activations in the backward pass to save memory.")
    disable_dropout: bool = flag(False, help=(
        "Switch every dropout of the model off while training (each torch Dropout's p = 0, as TRL's disable_dropout), "
        "the head's too; the saved config keeps its rates."))
    torch_compile: bool = flag(False, help=(
        "Compile the model with torch.compile (inductor; on a CPU it needs a C++ compiler): the backbone's and the "
        "head's layers fused, the head's fused losses eager; each epoch's last, shorter training batch is dropped, so "
        "that the step compiles once. Not with FSDP or DeepSpeed."))
    code_reassign_steps: int | None = integer(None, 0, optional=True, help=(
        "Heads that update themselves periodically (updates_periodically: lightrnn re-assigns its word-code table): "
        "every this many optimizer steps (default: eval_steps; 0: never, a fixed table)."))
    eval_steps: int | None = integer(None, 0, optional=True, help=(
        "Evaluate every this many optimizer steps (and always at the end)."))
    generation_metrics: list = listing(list, help=(
        "Generation metrics from hf_outheads/training/metrics: sacrebleu, chrf, rouge (seq2seq)."))
    num_generation_examples: int | None = integer(None, 1, optional=True, help=(
        "Evaluation examples used for generation metrics (null: all)."))
    generation_num_beams: int = integer(1, 1, help="Beams for generation-based evaluation.")
    sample_prompt: str | None = text(None, optional=True, help=(
        "Causal LM: prompt of the sample generated at the end (default: start of a validation text)."))
    sample_max_new_tokens: int = integer(40, 1, help="Causal LM: tokens of the generated sample.")
    output_dir: str = text("outputs/run", help="Folder for the model, tokenizer, card, metrics.jsonl and checkpoints/.")
    overwrite_output_dir: bool = flag(False, help=(
        "Let the run write into an output_dir that holds a finished model or files of no run (refused otherwise, "
        "as transformers' Trainer does)."))
    logging_steps: int = integer(10, 1, help="Log the training loss every this many optimizer steps.")
    save_steps: int | None = integer(None, 0, optional=True, help=(
        "Save an accelerate checkpoint every this many optimizer steps."))
    save_total_limit: int | None = integer(2, 1, optional=True, help=(
        "Checkpoints kept, the one just saved among them (the oldest deleted); null: keep every one (transformers' "
        "TrainingArguments)."))
    resume: str = text("auto", help=(
        "'auto' resumes from the latest checkpoint in output_dir/checkpoints, 'never', or a checkpoint path."))
    report_to: str = text("none", help=(
        "Trackers the run logs to besides metrics.jsonl, as Trainer's report_to: one of tensorboard, wandb, mlflow, "
        "trackio, aim, comet_ml, swanlab, clearml, dvclive, a comma list of them, 'all' (every installed one) or "
        "'none'; through accelerate's trackers, whose own variables (WANDB_PROJECT, MLFLOW_TRACKING_URI, ...) hold."))
    run_name: str | None = text(None, optional=True, help=(
        "The run's name in every tracker, as Trainer's run_name (null: output_dir's folder name)."))
    push_to_hub: bool = flag(False, help="Publish model, tokenizer and card to the Hub at the end.")
    hub_model_id: str | None = text(None, optional=True, help=(
        "Repository for push_to_hub, e.g. user/gpt2-drill-wikitext2 (default: output_dir's name)."))
    hub_private: bool = flag(False, help="Create the Hub repository as private.")
    license: str = text("apache-2.0", help="License written in the model card.")

    def __post_init__(self):
        super().__post_init__()
        report_to_names(self.report_to)


GROUPS = {"model": ModelOptions, "data": DataOptions, "training": TrainingOptions}  # `RunOptions`' fields, in order
FIELDS = {name: group for group, cls in GROUPS.items() for name in cls.declarations()}  # option -> its group
assert len(FIELDS) == sum(len(cls.declarations()) for cls in GROUPS.values()), "an option name in two groups"
NOT_SAVED = ("overwrite_output_dir",)  # how one command treats its folder, not what makes the run
# What a resumed run may give otherwise than its checkpoint was trained with (`checkpoints.resume_changes`): the
# run's length, which it goes on to, said in a line and recorded in metrics.jsonl and the card; and how the command
# evaluates, samples, reports, saves, publishes and feeds the model, which changes nothing that trains. Every other
# option changes what trains: resuming with another value is refused.
RUN_LENGTH = ("max_steps", "num_train_epochs")
RESUME_MAY_CHANGE = RUN_LENGTH + (
    "per_device_eval_batch_size", "max_eval_samples", "eval_steps", "generation_metrics", "num_generation_examples",
    "generation_num_beams", "sample_prompt", "sample_max_new_tokens", "logging_steps", "report_to", "run_name", "save_steps",
    "save_total_limit", "stop_after_steps", "resume", "output_dir", "push_to_hub", "hub_model_id", "hub_private",
    "license", "dataloader_num_workers", "preprocessing_num_workers", "gradient_checkpointing")
assert set(RESUME_MAY_CHANGE) <= set(FIELDS), set(RESUME_MAY_CHANGE) - set(FIELDS)


def reassign_interval(code_reassign_steps: int | None, eval_steps: int | None) -> int | None:
    """Optimizer steps between the updates of a head that updates itself periodically (lightrnn's table):
    code_reassign_steps, or eval_steps when it is null; 0 or null: none."""
    return eval_steps if code_reassign_steps is None else code_reassign_steps


@dataclass(frozen=True)
class RunOptions:
    """A run's options: the three groups, each checked when built, and what crosses them. `extra`:
    a script's own flags (`parse_options(extra=...)`), never saved."""

    model: ModelOptions = field(default_factory=ModelOptions)
    data: DataOptions = field(default_factory=DataOptions)
    training: TrainingOptions = field(default_factory=TrainingOptions)
    extra: dict = field(default_factory=dict, compare=False)

    def __post_init__(self):
        if self.training.max_steps is None and (self.data.streaming or self.training.num_train_epochs is None):
            raise ValueError("Set max_steps: " + ("a streamed dataset has no length." if self.data.streaming else
                                                  "num_train_epochs is null."))

    @classmethod
    def from_flat(cls, values: dict, where: str = "the options", extra: dict | None = None) -> "RunOptions":
        """Options from one flat mapping of option: value (a config file's, the command line's), each
        checked against its declaration; an unknown key is a ValueError listing the valid ones."""
        unknown = set(values) - set(FIELDS)
        if unknown:
            raise unknown_keys_error(unknown, where)
        grouped = {group: {} for group in GROUPS}
        for name, value in values.items():
            grouped[FIELDS[name]][name] = value
        return cls(**{group: GROUPS[group](**given) for group, given in grouped.items()}, extra=dict(extra or {}))

    def flat(self) -> dict:
        """Every option by name (the inverse of `from_flat`)."""
        return {name: getattr(getattr(self, group), name) for name, group in FIELDS.items()}


def saved_options(options: RunOptions) -> dict:
    """The options that make a run what it is, as `--config` reads them (the file `CONFIG_FILE`):
    every option but `NOT_SAVED`."""
    return {name: value for name, value in options.flat().items() if name not in NOT_SAVED}


def unknown_keys_error(keys, where) -> ValueError:
    return ValueError(f"Unknown option(s) {sorted(keys)} in {where}. Valid options: {', '.join(FIELDS)}.")


SHIPPED_CONFIGS = Path(__file__).resolve().parent / "configs"  # hf_outheads/training/configs, in a checkout as installed
SHIPPED_PREFIX = ("hf_outheads", "training", "configs")


def config_path(given: str) -> Path:
    """`--config` as given; where no such file exists, `hf_outheads/training/configs/<name>` (as the
    READMEs write it) is the config shipped with the package, so the documented commands run from any
    folder."""
    path = Path(given)
    if not path.exists() and path.parts[:-1] == SHIPPED_PREFIX and (SHIPPED_CONFIGS / path.name).is_file():
        return SHIPPED_CONFIGS / path.name
    if not path.is_file():
        raise ValueError(f"--config {given}: no such file. The shipped configs are {'/'.join(SHIPPED_PREFIX)}/"
                         f"{{{','.join(sorted(p.name for p in SHIPPED_CONFIGS.glob('*.yaml')))}}}.")
    return path


def load_yaml(path: str) -> dict:
    """A config file's options: one mapping of option: value (checked when the options are built)."""
    path = config_path(path)
    values = yaml_value(path.read_text(), f"--config {path}") or {}
    if not isinstance(values, dict):
        raise ValueError(f"{path} must hold a mapping of option: value.")
    unknown = set(values) - set(FIELDS)
    if unknown:
        raise unknown_keys_error(unknown, path)
    return values


def build_parser(description: str) -> CommandParser:
    """`--config` and one flag per option, in an argument group per options group (`--help`)."""
    parser = CommandParser(description=description)
    parser.add_argument("--config", help="YAML file of options; flags given here override it.")
    for group, cls in GROUPS.items():
        add_declared(parser.add_argument_group(f"{group} options", cls.__doc__), cls)
    return parser


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


def parse_options(argv=None, description: str = "Train an hf_outheads model.", extra=None) -> RunOptions:
    """Options from `--config` and `--key value` flags, checked. `extra(parser)` may add script flags,
    which are returned in `options.extra` (a dict)."""
    parser = build_parser(description)
    if extra:
        extra(parser)
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        parser.error(str(unknown_keys_error([u for u in unknown if u.startswith("--")] or unknown, "the command line")))
    given = vars(args)
    values = load_yaml(given.pop("config")) if given.get("config") else {}
    given.pop("config", None)
    extras = {key: given.pop(key) for key in list(given) if key not in FIELDS}
    flags = {}
    for cls in GROUPS.values():
        flags.update(declared_values(cls, given))
    values.update(flags)
    command_line_backbone(values, flags)
    return RunOptions.from_flat(values, "the command line", extras)
