"""A training run of `hf-outheads train` (hf_outheads/training/train.py, the command, parses its options first):
prepare it, train it (`loop.train_loop`), evaluate it and publish it.

This is the repository's one training loop (`loop.train_loop`) and optimizer (`make_optimizer`): the
quickstart, the scale comparison (`studies/scale_heads.py`) and `mtp-distill` call it in their
process (`train_in_process`). What makes a step fast is the run's, for every user: a compiled
step (`torch_compile`), torch's fused AdamW and TF32 matrix products on a GPU, batches collated and
checked by worker processes, and no read from the device between logging steps. Each run logs its
tokens/s, achieved TFLOP/s and MFU against its device's measured bf16 peak (`throughput.training_rates`,
compilation and the first steps left out) in metrics.jsonl's final event and its results.
"""

from __future__ import annotations

import contextlib
import gc
import json
import math
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.state import AcceleratorState, GradientState
from accelerate.utils import (DataLoaderConfiguration, DistributedType, ProjectConfiguration, broadcast_object_list,
                               set_seed)
from torch.utils.data import DataLoader
from transformers import get_scheduler

from hf_outheads.compat import CHECKPOINTING
from hf_outheads.tools.saved_tokenizer import load_saved_tokenizer
from hf_outheads.training import batches
from hf_outheads.training import data as data_lib
from hf_outheads.training.checkpoints import checkpoint_to_resume, load_checkpoint, resume_changes, save_checkpoint
from hf_outheads.training.evaluation import (copy_scores, evaluate_perplexity, fit_to_context, generate_texts,
                                             generation_scores, sample_text)
from hf_outheads.training.frequency_bands import FrequencyBands
from hf_outheads.training.launching import (accelerator_settings, check_process_count, check_sharding, refusal,
                                            with_launch_precision)
from hf_outheads.training.lora import with_lora
from hf_outheads.training.loop import train_loop
from hf_outheads.training.modeling import (build_model, parameter_counts, position_limit, step_flops, step_tokens,
                                           train_only, without_dropout)
from hf_outheads.training.options import RunOptions, reassign_interval, saved_options
from hf_outheads.training.publish import PushFailed, finish_run
from hf_outheads.training.safeguards import (EarlierWork, NonFiniteError, OutputDirInUse, RunLock, earlier_work,
                                             release_run_locks)
from hf_outheads.training.throughput import training_rates
from hf_outheads.training.tokenization import TRAINABLE, context_length, load_pretrained_tokenizer, train_tokenizer
from hf_outheads.training.tracking import (MetricsLog, Progress, make_trackers, saved_tracker_runs, start_log,
                                           start_trackers)


class InputError(ValueError):
    """What the run was given (its data, tokenizer files, checkpoint, backbone) cannot serve it: found
    while the run is prepared (`prepare_run`), before training starts."""


@contextlib.contextmanager
def input_checks():
    """A ValueError raised while a run is prepared is about its input: an `InputError`."""
    try:
        yield
    except (OutputDirInUse, EarlierWork):
        raise
    except ValueError as error:
        raise InputError(str(error)) from error


def get_tokenizer(accelerator, options, train_split, resuming: bool):
    """The pretrained model's tokenizer, a named one, or one trained here (on the main
    process, saved to output_dir, then loaded by the others; reused when resuming)."""
    model = options.model
    if model.tokenizer not in TRAINABLE:
        return load_pretrained_tokenizer(model.pretrained if model.tokenizer == "auto" else model.tokenizer)
    if data_lib.pretokenised(train_split):
        raise ValueError(f"The training data is already tokenised (an {data_lib.TOKEN_IDS} column), so a "
                         f"{model.tokenizer} tokenizer cannot be trained on it: set tokenizer to the folder or Hub id of "
                         "the tokenizer its ids were made with.")
    saved = Path(options.training.output_dir) / "tokenizer.json"
    if accelerator.is_main_process and not (resuming and saved.exists()):
        texts = data_lib.training_texts(train_split, options)
        tokenizer = train_tokenizer(texts, model.tokenizer, model.tokenizer_vocab_size, model.tokenizer_min_frequency,
                                    model.tokenizer_lowercase)
        start_log(options.training.output_dir)  # the run's first file: its folder is a run's from here on
        tokenizer.save_pretrained(options.training.output_dir)
    accelerator.wait_for_everyone()
    return load_saved_tokenizer(options.training.output_dir, auto=False)


def dataloader_workers(options, device) -> int:
    """`dataloader_num_workers`, by default 4 on a GPU (at most the cores this process may use) and
    0 on a CPU, where a worker would take a core from the step."""
    given = options.training.dataloader_num_workers
    if given is not None:
        return given
    return min(4, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1) \
        if device.type == "cuda" else 0


def get_dataloaders(accelerator, options, tokenizer, model, train_split, validation_split):
    """(train, evaluation, generation-or-None) dataloaders, not yet prepared, the number of
    validation examples (None streamed) and the training examples. Each batch is built and checked
    against `model`'s vocabulary and the run's lengths on the host (`batches.CheckedCollator`), by
    worker processes (`dataloader_workers`) that stay up across epochs and evaluations, so that no
    epoch or evaluation starts by waiting for new ones. A compiled run (`torch_compile`) drops each
    epoch's last, shorter training batch: a batch of another size would compile the model again
    (with dynamic shapes) in the middle of training."""
    with accelerator.main_process_first():
        train, validation = data_lib.tokenised_splits(train_split, validation_split, tokenizer, options)
    streaming, training = not hasattr(train, "__len__"), options.training
    workers = dataloader_workers(options, accelerator.device)
    numbered = (lambda split: split) if streaming else batches.NumberedExamples

    def loader(split, name, batch_size, **settings):
        collator = batches.CheckedCollator(tokenizer, name, model.get_input_embeddings().num_embeddings,
                                           model.config.vocab_size, batches.lengths(options),
                                           causal=options.model.task == "causal_lm")
        return DataLoader(numbered(split), batch_size=batch_size, collate_fn=collator, num_workers=workers,
                          pin_memory=torch.cuda.is_available(), persistent_workers=workers > 0 and not streaming,
                          **settings)

    train_dl = loader(train, "training", training.per_device_train_batch_size, shuffle=not streaming,
                      drop_last=bool(training.torch_compile))
    eval_dl = loader(validation, "validation", training.per_device_eval_batch_size)
    gen_dl = None
    if training.generation_metrics:  # (a seq2seq run's: `preflight.check_generation_metrics`)
        subset = validation
        if training.num_generation_examples is not None:
            subset = validation.take(training.num_generation_examples) if streaming else validation.select(
                range(min(training.num_generation_examples, len(validation))))
        gen_dl = loader(subset, "validation", training.per_device_eval_batch_size)
    return train_dl, eval_dl, gen_dl, (None if streaming else len(validation)), train


def make_optimizer(model, options, fused: bool = False):
    """AdamW (torch's fused kernel when `fused`); no weight decay on 1-d parameters (biases, norms);
    the head's own parameters (not the shared embedding E) at `head_learning_rate` when it is set."""
    head, training = {id(p) for p in model.head.parameters()}, options.training
    groups = []
    for in_head, lr in ((False, training.learning_rate), (True, training.head_learning_rate or training.learning_rate)):
        for matrix, decay in ((True, training.weight_decay), (False, 0.0)):
            params = [p for p in model.parameters()
                      if p.requires_grad and (id(p) in head) == in_head and (p.ndim >= 2) == matrix]
            if params:
                groups.append({"params": params, "weight_decay": decay, "lr": lr})
    return torch.optim.AdamW(groups, lr=training.learning_rate, betas=(training.adam_beta1, training.adam_beta2),
                             fused=fused or None)


def batches_per_epoch(dataloader) -> int | None:
    """Batches in an epoch of `dataloader`; None for a streamed dataset (accelerate's prepared
    dataloader has `__len__`, which raises a TypeError when its dataset has no length)."""
    try:
        return len(dataloader)
    except TypeError:
        return None


def total_steps(options, train_dl) -> int:
    """Optimizer steps: max_steps, or num_train_epochs over this process's prepared dataloader."""
    training = options.training
    if training.max_steps is not None:
        return training.max_steps
    batches = batches_per_epoch(train_dl)
    if batches is None:
        raise ValueError("A streamed dataset has no length: set max_steps.")
    return math.ceil(training.num_train_epochs * math.ceil(batches / training.gradient_accumulation_steps))


def evaluate_all(accelerator, model, eval_dl, gen_dl, tokenizer, options, final: bool = False, bands=None) -> dict:
    results = evaluate_perplexity(accelerator, model, eval_dl, options.model.task, bands)
    if gen_dl is not None:
        sources, predictions, references = generate_texts(accelerator, model, gen_dl, tokenizer, options)
        results["eval_generated"] = len(predictions)
        if accelerator.is_main_process:
            metrics = options.training.generation_metrics
            results.update(generation_scores(metrics, predictions, references))
            results.update(copy_scores(metrics, sources, references, options.data.source_prefix))
            if final:
                results["samples"] = [{"source": s, "prediction": p, "reference": r}
                                      for s, p, r in list(zip(sources, predictions, references))[:5]]
    return results


def accelerator_for(options, resumed_ids: dict | None = None) -> Accelerator:
    """The Accelerator, accumulating `gradient_accumulation_steps` micro-batches per optimizer step
    (`loop.window_step`: `accelerator.accumulate`, DeepSpeed's own under DeepSpeed); several processes
    on a CPU-only machine form a CPU process group, and a launch asking for FSDP or DeepSpeed shards
    or stops (`launching.accelerator_settings`, `launching.check_sharding`). The output_dir is claimed
    (`claim_output_dir`) before a tracker writes to it; then the trackers of `report_to` start with the run's
    options as their config (`tracking.start_trackers`), continuing a resumed run's (`resumed_ids`: the tracker
    run ids saved in output_dir)."""
    training = options.training
    accelerator = Accelerator(
        mixed_precision=training.mixed_precision, log_with=make_trackers(options, resumed_ids) or None,
        gradient_accumulation_steps=training.gradient_accumulation_steps,
        project_config=ProjectConfiguration(project_dir=training.output_dir),
        # batches pinned on a GPU (`get_dataloaders`) are copied to it without the host waiting for the device
        dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True, data_seed=training.data_seed,
                                                  non_blocking=torch.cuda.is_available()),
        **accelerator_settings(),
    )
    try:
        check_sharding(accelerator)
        if options.model.use_peft and accelerator.distributed_type in (DistributedType.FSDP, DistributedType.DEEPSPEED):
            raise ValueError(f"use_peft is not supported with {accelerator.distributed_type.value} here: launch without "
                             "the sharding config (LoRA's frozen backbone needs no optimizer state), or without "
                             "--use_peft.")
        if training.torch_compile and accelerator.distributed_type in (DistributedType.FSDP, DistributedType.DEEPSPEED):
            raise ValueError(f"torch_compile is not supported with {accelerator.distributed_type.value} here: launch "
                             "without --torch_compile, or without the sharding config.")
        if accelerator.gradient_accumulation_steps != training.gradient_accumulation_steps:
            raise ValueError(f"The accelerate config sets gradient_accumulation_steps to "
                             f"{accelerator.gradient_accumulation_steps}, this run's options to "
                             f"{training.gradient_accumulation_steps}: remove it from the accelerate config (or set "
                             "both the same); train.py's option sets it.")
    except ValueError as error:
        raise refusal(error) from None
    check_process_count(accelerator)
    claim_output_dir(accelerator, options)
    start_trackers(accelerator, options, saved_options(options), resumed_ids)
    return accelerator


def claim_output_dir(accelerator, options) -> None:
    """Before anything is written to output_dir: the main process makes it, takes its lock
    (`lock_output_dir`) and checks that the run replaces nothing it was not told to replace
    (`safeguards.earlier_work`); a refusal stops every process of the launch together. The folders
    it makes are removed with the lock when the run ends leaving them empty (`RunLock.release`)."""
    refused, output_dir = None, options.training.output_dir
    if accelerator.is_main_process:
        try:
            missing = [p for p in (Path(output_dir), *Path(output_dir).parents) if not p.exists()]
            os.makedirs(output_dir, exist_ok=True)
            lock_output_dir(output_dir).made = missing[-1] if missing else None
            work = None if options.training.overwrite_output_dir else earlier_work(output_dir)
            if work:
                raise EarlierWork(f"{work}. Keep it with another --output_dir, or replace it with "
                                  "--overwrite_output_dir true.")
        except (OutputDirInUse, EarlierWork) as error:
            refused = error
    if accelerator.num_processes > 1:
        refused = broadcast_object_list([refused])[0]
    if refused is not None:
        raise refused


def lock_output_dir(output_dir) -> RunLock:
    """Refuse to start when another run writes `output_dir` (`safeguards.RunLock`); the lock
    is released when the run ends (`training_function`) or, at the latest, when the process exits."""
    lock = RunLock(output_dir)
    note = lock.acquire()
    if note:
        print(note)
    return lock


def resume_or_start_fresh(accelerator, options, model, checkpoint, max_steps: int) -> tuple[Progress, dict]:
    """(Progress of the checkpoint loaded into the prepared objects, the run's length options it is resumed
    with otherwise: `checkpoints.resume_changes`, which refuses any other option given otherwise), saying in a
    line what changed and when it is the end of a finished run; a fresh run removes the checkpoints another run
    left in output_dir, so none of them is resumed later."""
    if checkpoint is not None:
        progress = Progress(**load_checkpoint(accelerator, model, checkpoint))
        changes = resume_changes(checkpoint, options, accelerator.unwrap_model(model).config.head_class)
        accelerator.print(f"Resumed from {checkpoint} (step {progress.step})")
        if changes:
            listed = ", ".join(f"{name} {json.dumps(new)} (it was trained with {json.dumps(old)})"
                               for name, (old, new) in changes.items())
            accelerator.print(f"Resuming {checkpoint} with {listed}: the run goes on to its new length; metrics.jsonl "
                              "and the model card record the change.")
        if progress.step >= max_steps:
            accelerator.print(f"The run in {options.training.output_dir} had already finished (step {progress.step} of "
                              f"{max_steps}): nothing is trained; it is evaluated and saved again. To train anew, "
                              "use another --output_dir or --resume never.")
        return progress, changes
    if accelerator.is_main_process:
        shutil.rmtree(Path(options.training.output_dir) / "checkpoints", ignore_errors=True)
    accelerator.wait_for_everyone()
    return Progress(), {}


@dataclass
class PreparedRun:
    """Everything a run uses, prepared by accelerate (`prepare_run`)."""

    options: RunOptions
    accelerator: Accelerator
    tokenizer: object
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: object
    train_dl: DataLoader
    eval_dl: DataLoader
    gen_dl: DataLoader | None
    validation_split: object
    n_validation: int | None
    counts: dict
    word_counts: torch.Tensor  # training-set count of every word (frequency bands)
    max_steps: int
    progress: Progress
    log: MetricsLog


def prepare_run(options) -> PreparedRun:
    """Accelerator, data, tokenizer, model, optimizer and schedule, prepared; resumed from the
    latest checkpoint when there is one. fp32 matrix products may use TF32 on a GPU. The run's options
    (`PreparedRun.options`, which it saves) hold the mixed precision it trains with
    (`launching.with_launch_precision`)."""
    options, precision = with_launch_precision(options)
    training = options.training
    checkpoint = checkpoint_to_resume(training.output_dir, training.resume)
    resumed_ids = saved_tracker_runs(training.output_dir) if checkpoint is not None else None
    accelerator = accelerator_for(options, resumed_ids)  # claims output_dir before anything in it is written
    if precision:
        accelerator.print(precision)
    torch.backends.cuda.matmul.allow_tf32 = True  # (the legacy switch: inductor reads the precision through it)
    set_seed(training.seed)
    with accelerator.main_process_first():
        train_split, validation_split = data_lib.select_splits(data_lib.load_raw(options), options)
    tokenizer = get_tokenizer(accelerator, options, train_split, checkpoint is not None)
    model = build_model(options, tokenizer)
    tokenizer.model_max_length = context_length(options, position_limit(model))  # saved with the model
    train_dl, eval_dl, gen_dl, n_validation, train_set = get_dataloaders(accelerator, options, tokenizer, model,
                                                                         train_split, validation_split)
    word_counts = torch.as_tensor(data_lib.word_counts(train_set, model.config.vocab_size))
    trainable = options.model.trainable_modules
    if not trainable or "head" in trainable:  # a frozen head keeps what it derived from its counts (mtp's draft words)
        model.head.set_word_counts(word_counts)
    if tokenizer.pad_token_id is not None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
    train_only(model, options.model.trainable_modules)
    if options.model.use_peft:
        model = with_lora(model, options.model)
    if training.disable_dropout:
        without_dropout(model)
    if training.gradient_checkpointing:
        getattr(model, CHECKPOINTING[0])()  # (its name before transformers 5.24: compat.py)
    if training.torch_compile:
        model.compile()  # in place: the same parameters, state-dict keys and save_pretrained
    fused = accelerator.device.type == "cuda" and accelerator.distributed_type != DistributedType.DEEPSPEED
    counts, optimizer = parameter_counts(model), make_optimizer(model, options, fused)
    counts["train_flops_per_step"] = step_flops(model, options, accelerator.num_processes)
    counts["train_tokens_per_step"] = step_tokens(options, accelerator.num_processes)
    model, optimizer, train_dl, eval_dl = accelerator.prepare(model, optimizer, train_dl, eval_dl)
    if batches_per_epoch(train_dl) == 0:  # a compiled run drops a short last batch
        raise ValueError(f"The training set has fewer examples than one batch of every process "
                         f"({training.per_device_train_batch_size} x {accelerator.num_processes}), and a compiled run "
                         "(torch_compile) trains on full batches only: lower per_device_train_batch_size or add "
                         "training data.")
    max_steps = total_steps(options, train_dl)  # from the prepared (per-process) dataloader
    scheduler = accelerator.prepare(get_scheduler(  # accelerate steps it once per process
        training.lr_scheduler_type, optimizer, num_warmup_steps=training.warmup_steps * accelerator.num_processes,
        num_training_steps=max_steps * accelerator.num_processes,
        scheduler_specific_kwargs=training.lr_scheduler_kwargs or None))
    gen_dl = accelerator.prepare(gen_dl) if gen_dl is not None else None
    progress, changes = resume_or_start_fresh(accelerator, options, model, checkpoint, max_steps)
    log = MetricsLog(accelerator, training.output_dir)
    log.truncate_after(progress.step if progress.step else -1)  # a fresh run starts a fresh log
    if changes:  # the run's history: what the card states beside the final values
        log.log({"event": "resume", "checkpoint": str(checkpoint), "changed": changes}, progress.step)
    if progress.step == 0:
        log.log({"event": "start", **counts, "num_processes": accelerator.num_processes,
                 "distributed_type": accelerator.distributed_type.value, "prepared_model": type(model).__name__,
                 "validation_examples": n_validation, "max_steps": max_steps}, 0)
    return PreparedRun(options=options, accelerator=accelerator, tokenizer=tokenizer, model=model, optimizer=optimizer,
                       scheduler=scheduler, train_dl=train_dl, eval_dl=eval_dl, gen_dl=gen_dl,
                       validation_split=validation_split, n_validation=n_validation, counts=counts, word_counts=word_counts,
                       max_steps=max_steps, progress=progress, log=log)


def eager(options):
    """Where a compiled run (`torch_compile`) evaluates and generates: eagerly, so that evaluation
    batches and every generation length cost no compilation (`torch.compiler.set_stance`, torch >= 2.6)."""
    if options.training.torch_compile and hasattr(torch.compiler, "set_stance"):
        return torch.compiler.set_stance("force_eager")
    return contextlib.nullcontext()


COMPILE_STEPS = 5  # a compiled run's first steps compile (and may recompile): left out of its rates


def final_results(run, step_times) -> dict:
    """The final evaluation (and sample), the run's counts, and what its steps achieved
    (`throughput.training_rates`: the first step, or a compiled run's first `COMPILE_STEPS`, left out)."""
    options, accelerator, training = run.options, run.accelerator, run.options.training
    results = evaluate_all(accelerator, run.model, run.eval_dl, run.gen_dl, run.tokenizer, options, final=True,
                           bands=FrequencyBands(run.word_counts))
    warm = COMPILE_STEPS if training.torch_compile else 1
    results.update(run.counts, validation_examples=run.n_validation,
                   **training_rates(step_times, warm, run.counts["train_flops_per_step"],
                                    run.counts["train_tokens_per_step"], accelerator.device, accelerator.num_processes),
                   loss_path=accelerator.unwrap_model(run.model).head.loss_path(accelerator.device))
    prompt = training.sample_prompt or data_lib.sample_prompt(run.validation_split, options, run.tokenizer)
    # on every process: a sharded model (FSDP, ZeRO-3) runs on all of them at once; no prompt (pre-tokenised ids
    # the tokenizer does not spell): no sample
    if options.model.task == "causal_lm" and run.tokenizer(prompt, add_special_tokens=False)["input_ids"]:
        model = accelerator.unwrap_model(run.model)
        prompt, new_tokens = fit_to_context(run.tokenizer, prompt, training.sample_max_new_tokens, position_limit(model))
        sample = sample_text(model, run.tokenizer, prompt, new_tokens, training.seed)
        if accelerator.is_main_process:  # the card's usage code generates the sample again
            results.update(sample=sample, sample_prompt=prompt, sample_max_new_tokens=new_tokens)
    return results


def periodic_update_hook(accelerator, model, options) -> tuple:
    """(interval, hook) for a head that updates itself periodically (`head.updates_periodically`,
    e.g. lightrnn re-assigning its word-code table) every `code_reassign_steps` (default: eval_steps);
    the head's statistics are summed over processes with `accelerator.reduce`. Statistics collected
    since the last update are not checkpointed."""
    head = accelerator.unwrap_model(model).head
    training = options.training
    every = reassign_interval(training.code_reassign_steps, training.eval_steps)
    if not head.updates_periodically or not every:  # 0: no updates, no statistics collected
        return None, None
    head.begin_periodic_updates()
    return every, lambda: head.periodic_update(reduce=lambda tensor: accelerator.reduce(tensor, reduction="sum"))


def training_function(options, callbacks=()) -> dict:
    """Train, evaluate and publish (`run_training`); the output_dir's lock is released however it ends.
    `callbacks`: called after every optimizer step (`loop.train_loop`)."""
    try:
        return run_training(options, callbacks)
    finally:
        release_run_locks()


def train_in_process(options, callbacks=()) -> dict:
    """One run in a process that may hold others (a study's queue, `mtp-distill`), as a launched run:
    the state an earlier run left is dropped first (accelerate's process-wide `AcceleratorState` and
    `GradientState`, torch.compile's compiled code, which inductor's caches on disk compile again
    quickly, and freed device memory)."""
    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    torch._dynamo.reset()
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return training_function(options, callbacks)


def run_training(options, callbacks=()) -> dict:
    with input_checks():
        run = prepare_run(options)
    accelerator, options, training = run.accelerator, run.options, run.options.training

    def evaluate():
        with eager(options):
            results = evaluate_all(accelerator, run.model, run.eval_dl, run.gen_dl, run.tokenizer, options)
        return {**results, "train_flops": run.progress.step * run.counts["train_flops_per_step"]}

    def save():
        save_checkpoint(accelerator, run.model, training.output_dir, vars(run.progress), training.save_total_limit,
                        options)

    hooks = [(training.eval_steps, evaluate), periodic_update_hook(accelerator, run.model, options)]
    interrupted, step_times = train_loop(accelerator, options, run.model, run.optimizer, run.scheduler, run.train_dl,
                                         hooks, run.log, run.progress, run.max_steps, save, callbacks)
    if interrupted:
        accelerator.print(f"Stopped after step {run.progress.step} (stop_after_steps); run the same command again "
                          "to resume and finish.")
        accelerator.end_training()
        return {"interrupted": True, "step": run.progress.step}
    with eager(options):
        results = final_results(run, step_times)
    results["train_flops"] = run.progress.step * run.counts["train_flops_per_step"]
    results["train_tokens"] = run.progress.step * run.counts["train_tokens_per_step"]
    run.log.log({"event": "final",
                 **{k: v for k, v in results.items() if k not in ("samples", "sample", "sample_prompt", "sample_max_new_tokens")}}, run.progress.step)
    accelerator.wait_for_everyone()
    # every process: gathers a sharded model's full weights; a LoRA run's model saves its merged weights
    state_dict = None if options.model.use_peft else accelerator.get_state_dict(run.model)
    failed_push = None
    if accelerator.is_main_process:
        try:
            finish_run(accelerator.unwrap_model(run.model), run.tokenizer, options, results, state_dict)
        except PushFailed as error:  # the folder is complete: said once every process has ended its training
            failed_push = error
    accelerator.wait_for_everyone()
    accelerator.end_training()
    if accelerator.num_processes > 1:  # a failed push too: said, then the same exit as a finished run
        exit_without_teardown(None if failed_push is None else refusal(failed_push, status=1).code)
    if failed_push is not None:
        raise failed_push
    return results


def exit_without_teardown(failure: str | None = None) -> None:
    """End a worker of a multi-process run once everything is written and the process group is
    destroyed (`end_training`), skipping the teardown of the distributed objects: freeing them
    after the peers have gone sporadically hung in gloo's destructors (CI, in a two-process run
    whose files were all written; pytorch/pytorch#75097), which a run then never finishes.
    `failure`: what failed after the folder was written (a push), said on stderr; the exit status is
    then 1."""
    if failure is not None:
        print(failure, file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    release_run_locks()
    os._exit(0 if failure is None else 1)
