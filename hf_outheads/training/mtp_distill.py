"""Self-distillation of an `mtp` model's future-token predictors: they learn the model's own greedy
continuations, which are what drafting (`generate(..., use_mtp=True)`) has to guess, while the
backbone and the shared output head stay frozen, so that the next-token model (its perplexity and
every output of `generate()`) is unchanged. Medusa's self-distillation (Cai et al. 2024, arXiv
2401.10774, Sec. 2.3.2) trains its draft heads on the model's own outputs for the same reason: the
corpus's text is not what the model generates (a fine-tuned predictor may agree with the next-token
head on half of the text's positions, yet on a third of greedy output's).

    hf-outheads mtp-distill RUN_DIR --output_dir OUT [--prompts 512 --max_steps 300] [--overwrite]

RUN_DIR is a model folder of an `mtp` head that `hf-outheads train` (hf_outheads/training/train.py) wrote: its
`train_config.yaml` names the training data; any other folder is refused before anything is
generated. The prompts are the first `--prompt_tokens` tokens of texts of the training split (never the
validation split, on which `studies/mtp_speed.py` measures); each gets `--new_tokens` greedy tokens,
and the predictors train on the continuations (the prompt's positions and anything after an
end-of-sequence token carry no label).

This module is a data recipe: the training is `hf_outheads/training/run.py`'s (`run.train_in_process`), on the
examples as a pre-tokenised dataset (`input_ids`, `labels`), starting from RUN_DIR's model with its
head kept (`head_type: null`), only `head.predictors` trainable (`trainable_modules`), every dropout
off (`disable_dropout`) and a cosine schedule with 10% warm-up. OUT receives what a train.py run
writes (the model, its tokenizer, card, metrics and options) and `distill.json` (the settings and the
predictors' losses before and after), written beside it and swapped in whole
(`hf_outheads.tools.folders.staged_folder`): a new or empty folder, or any other with `--overwrite`, never
RUN_DIR, a folder inside it or around it.
"""

from __future__ import annotations

import dataclasses
import json
import tempfile
from dataclasses import dataclass
from pathlib import Path

import hf_outheads  # its names are imported when first used: `--help` answers without torch
from hf_outheads.head_options import DeclaredOptions, integer, number

from hf_outheads.tools.command_line import CommandParser, program, refuse
from hf_outheads.training.declared_flags import add_declared, declared_values


@dataclass(frozen=True)
class DistillOptions(DeclaredOptions):
    """How much is generated and how the predictors train."""

    prompts: int = integer(512, 1, help="Prompts from the training split.")
    prompt_tokens: int = integer(32, 1, help="Tokens per prompt.")
    new_tokens: int = integer(64, 1, help="Greedy tokens generated after each prompt.")
    batch_size: int = integer(16, 1, help="Sequences per generation and per training step.")
    max_steps: int = integer(300, 1, help="Training steps of the predictors.")
    learning_rate: float = number(1e-3, 0.0, open_low=True, help="Peak learning rate (cosine, 10% warm-up).")
    seed: int = integer(0, 0, help="Seed of the predictors' training.")


def parse_args(argv=None):
    """The run, output folder and `--overwrite`, and the checked `DistillOptions` as `args.options`."""
    parser = CommandParser(description=__doc__)
    parser.add_argument("run", help="A model folder of an mtp head written by `hf-outheads train` (with its "
                                    "train_config.yaml).")
    parser.add_argument("--output_dir", required=True, help="Where the distilled model goes: a new or empty folder.")
    parser.add_argument("--overwrite", action="store_true",
                        help="Replace output_dir when it is not empty (the whole folder, swapped in once written).")
    add_declared(parser.add_argument_group("distillation options", DistillOptions.__doc__), DistillOptions)
    args = parser.parse_args(argv)
    try:
        args.options = DistillOptions(**declared_values(DistillOptions, vars(args)))
    except ValueError as error:
        raise refuse(f"{program(__file__)}: error: {error}") from None
    return args


def require_mtp(config) -> None:
    """Self-distillation trains an `mtp` head's predictors: a ValueError for any other model."""
    head = getattr(config, "head_type", None)
    if head != "mtp":
        raise ValueError(f"self-distillation trains an `mtp` head's future-token predictors; this model's head is "
                         f"{head!r}. Train with --head_type mtp first.")


def greedy_examples(model, prompts: torch.Tensor, new_tokens: int, batch_size: int, pad_token_id: int,
                    eos_token_id: int | None) -> dict[str, torch.Tensor]:
    """`input_ids` (the prompts, `(n, p)`, and their greedy continuations; pad tokens after an end of
    sequence) and `labels` (the continuations' tokens; -100 on the prompts and after the first end of
    sequence), `(n, p + new_tokens)` each (no gradients: `generate` computes none)."""
    import torch

    IGNORE_INDEX = hf_outheads.IGNORE_INDEX
    model.eval()
    rows = []
    for batch in prompts.split(batch_size):  # prompts of one length: no padding, so batched greedy is greedy
        out = model.generate(batch, attention_mask=torch.ones_like(batch), max_new_tokens=new_tokens, do_sample=False,
                             pad_token_id=pad_token_id, eos_token_id=eos_token_id)  # (a prompt's pad id is a token)
        rows.append(torch.nn.functional.pad(out, (0, prompts.shape[1] + new_tokens - out.shape[1]), value=pad_token_id))
    ids = torch.cat(rows)
    labels = ids.clone()
    labels[:, : prompts.shape[1]] = IGNORE_INDEX
    if eos_token_id is not None:
        ended = (ids == eos_token_id) & (labels != IGNORE_INDEX)
        after = (ended.cumsum(1) - ended.int()) > 0  # past the first end of sequence of the continuation
        labels[after] = IGNORE_INDEX
    return {"input_ids": ids, "labels": labels}


def predictor_losses(model, examples: dict[str, torch.Tensor], batch_size: int) -> dict[str, float]:
    """Each depth's mean future-token loss over `examples` (`aux_terms`, `mtp_nll_k`; labels give them in
    evaluation too), averaged over batches."""
    import torch

    model.eval()
    totals, batches = {}, 0
    with torch.no_grad():
        for ids, labels in zip(examples["input_ids"].split(batch_size), examples["labels"].split(batch_size)):
            for name, value in model(input_ids=ids, labels=labels).aux_terms.items():
                totals[name] = totals.get(name, 0.0) + float(value)
            batches += 1
    return {name: total / batches for name, total in totals.items()}


def distill_options(run: Path, data_files: dict, length: int, output_dir, settings: DistillOptions):
    """train.py's options of the distillation: RUN's model and tokenizer, its head kept with only the
    predictors trainable and every dropout off, on the examples' files (their first batch evaluated)."""
    from hf_outheads.training.options import RunOptions

    steps = settings.max_steps
    return RunOptions.from_flat(dict(
        task="causal_lm", pretrained=str(run), head_type=None, tokenizer="auto", trainable_modules=["head.predictors"],
        disable_dropout=True, data_files=data_files, block_size=length, max_eval_samples=settings.batch_size,
        per_device_train_batch_size=settings.batch_size, per_device_eval_batch_size=settings.batch_size,
        max_steps=steps, learning_rate=settings.learning_rate, lr_scheduler_type="cosine",
        warmup_steps=max(1, steps // 10), weight_decay=0.0, seed=settings.seed, logging_steps=max(1, steps // 10),
        sample_max_new_tokens=min(8, settings.new_tokens), output_dir=str(output_dir), resume="never",
        report_to="none"))


def distill(run, examples: dict[str, torch.Tensor], output_dir, settings: DistillOptions) -> dict:
    """Train the predictors of RUN's `mtp` model (`run`: a folder with its tokenizer) on `examples` with
    train.py into `output_dir` (new or empty); the rest of the model keeps its values. Returns the
    predictors' losses on `examples` before and after, and the count of trained parameters. A run that
    cannot go on is a ValueError saying why."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM

    from hf_outheads.training.preflight import check_run
    from hf_outheads.training.run import train_in_process

    model = AutoModelForCausalLM.from_pretrained(run)
    require_mtp(model.config)
    before = predictor_losses(model, examples, settings.batch_size)
    with tempfile.TemporaryDirectory(prefix="mtp_distill-") as folder:
        data = str(Path(folder) / "examples.parquet")
        Dataset.from_dict({key: value.tolist() for key, value in examples.items()}).to_parquet(data)
        options = distill_options(Path(run), {"train": data, "validation": data}, examples["input_ids"].shape[1],
                                  output_dir, settings)
        check_run(options)
        results = train_in_process(options)
    trained = AutoModelForCausalLM.from_pretrained(output_dir)
    return {"losses_before": before, "losses_after": predictor_losses(trained, examples, settings.batch_size),
            "trained_parameters": results["parameters"], "examples": len(examples["input_ids"])}


def leading_tokens(texts, tokenizer, count: int, length: int) -> list[list[int]]:
    """The first `length` token ids of each of the first `count` texts that have as many (prompts)."""
    chosen = []
    for text in texts:
        ids = tokenizer(text)["input_ids"]
        if len(ids) >= length:
            chosen.append(ids[:length])
        if len(chosen) == count:
            break
    return chosen


def training_prompts(options, tokenizer, count: int, length: int) -> torch.Tensor:
    """`(count, length)` token ids: the first `length` tokens of the run's training texts that have as many."""
    import torch

    from hf_outheads.training import data as data_lib

    train, _ = data_lib.select_splits(data_lib.load_raw(options), options)
    chosen = leading_tokens(data_lib.training_texts(train, options), tokenizer, count, length)
    if not chosen:
        raise ValueError(f"no training text of the run has {length} tokens: lower --prompt_tokens.")
    return torch.tensor(chosen)


def run_options(run: Path):
    """The training options of `run` (its `CONFIG_FILE`), after checking that it holds an `mtp`
    model: a ValueError saying why not, before anything is loaded or generated."""
    from transformers import AutoConfig

    import hf_outheads.configuration_outheads  # noqa: F401  (registers the Auto classes: no remote code runs)

    from hf_outheads.training.options import CONFIG_FILE, parse_options

    if not (run / CONFIG_FILE).is_file():
        raise ValueError(f"{run} has no {CONFIG_FILE}: give a model folder that `hf-outheads train` wrote.")
    try:
        config = AutoConfig.from_pretrained(run)
    except (OSError, ValueError) as error:
        raise ValueError(f"{run} holds no model that loads: {str(error).strip().splitlines()[0]}") from None
    require_mtp(config)
    return parse_options(["--config", str(run / CONFIG_FILE)])


def main(argv=None):
    args = parse_args(argv)
    import torch  # (after the parse: `--help` and a wrong option answer without torch)
    from transformers import AutoModelForCausalLM

    from hf_outheads.tools.folders import staged_folder, writable_target

    from hf_outheads.training.preflight import run_sources
    from hf_outheads.tools.saved_tokenizer import load_saved_tokenizer

    settings = args.options
    run, target = Path(args.run), dict(overwrite=args.overwrite, overwrite_hint="pass --overwrite")
    try:  # everything refused before anything is generated or written
        options = run_options(run)
        sources = [run, *run_sources(options)]
        writable_target(args.output_dir, sources=sources, **target)
        tokenizer = load_saved_tokenizer(run)
        if tokenizer is None:
            raise ValueError(f"{run} holds no tokenizer: give a model folder that `hf-outheads train` wrote.")
        prompts = training_prompts(options, tokenizer, settings.prompts, settings.prompt_tokens)
    except (ValueError, OSError) as error:  # (TargetIsSource is a ValueError; a data file not found an OSError)
        raise refuse(f"{program(__file__)}: error: {error}") from None
    torch.manual_seed(settings.seed)
    model = AutoModelForCausalLM.from_pretrained(run)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    examples = greedy_examples(model, prompts, settings.new_tokens, settings.batch_size, pad, tokenizer.eos_token_id)
    del model
    try:
        with staged_folder(args.output_dir, sources=sources, **target) as written:
            try:
                result = distill(run, examples, written, settings)
            except ValueError as error:  # what stops train.py's run: its input, a bad batch, a non-finite loss
                raise refuse(f"{program(__file__)}: error: {error}") from None
            result = {"run": str(run), "overwrite": args.overwrite, **dataclasses.asdict(settings), **result}
            (written / "distill.json").write_text(json.dumps(result, indent=1) + "\n")
    except FileExistsError as error:  # output_dir filled by another writer since it was checked
        raise refuse(f"{program(__file__)}: error: {error}") from None
    print(json.dumps(result))


if __name__ == "__main__":
    main()
