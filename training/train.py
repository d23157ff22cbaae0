"""Train an hf_outheads model (causal LM or seq2seq) with accelerate, evaluate it and publish it.

    accelerate launch training/train.py --config training/configs/quickstart_lm.yaml [--key value ...]

The head is part of the model config (`head_type`, `head_options`): nothing here depends
on which head it is. `python training/train.py --help` lists every option.
"""

from __future__ import annotations

import math
import os
import sys
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `training` importable when run as a script

import torch
from accelerate import Accelerator
from accelerate.utils import DataLoaderConfiguration, ProjectConfiguration, set_seed
from torch.utils.data import DataLoader
from tqdm.auto import tqdm
from transformers import DataCollatorForSeq2Seq, PreTrainedTokenizerFast, get_scheduler

from training import data as data_lib
from training.evaluation import evaluate_perplexity, generate_texts, generation_scores, sample_text
from training.modeling import build_model, parameter_counts
from training.options import parse_options
from training.publish import finish_run
from training.tokenization import TRAINABLE, load_pretrained_tokenizer, train_tokenizer
from training.tracking import MetricsLog, Progress, checkpoint_number, checkpoint_to_resume, trackers


def parse_args(argv=None):
    return parse_options(argv, description=__doc__)


def get_tokenizer(accelerator, options, train_split, resuming: bool):
    """The pretrained model's tokenizer, a named one, or one trained here (on the main
    process, saved to output_dir, then loaded by the others; reused when resuming)."""
    if options.tokenizer not in TRAINABLE:
        name = options.pretrained if options.tokenizer == "auto" else options.tokenizer
        if name is None:
            raise ValueError("tokenizer: auto needs a pretrained model; use tokenizer: bpe / wordlevel or a tokenizer path.")
        return load_pretrained_tokenizer(name)
    saved = Path(options.output_dir) / "tokenizer.json"
    if accelerator.is_main_process and not (resuming and saved.exists()):
        texts = data_lib.training_texts(train_split, options)
        tokenizer = train_tokenizer(texts, options.tokenizer, options.tokenizer_vocab_size,
                                    options.tokenizer_min_frequency, options.tokenizer_lowercase)
        tokenizer.save_pretrained(options.output_dir)
    accelerator.wait_for_everyone()
    return PreTrainedTokenizerFast.from_pretrained(options.output_dir)


def get_dataloaders(accelerator, options, tokenizer, train_split, validation_split):
    """(train, evaluation, generation-or-None) dataloaders, not yet prepared."""
    with accelerator.main_process_first():
        train, validation = data_lib.tokenised_splits(train_split, validation_split, tokenizer, options)
    collator = DataCollatorForSeq2Seq(tokenizer, label_pad_token_id=-100, pad_to_multiple_of=None)
    streaming = not hasattr(train, "__len__")
    train_dl = DataLoader(train, shuffle=not streaming, batch_size=options.per_device_train_batch_size, collate_fn=collator)
    eval_dl = DataLoader(validation, batch_size=options.per_device_eval_batch_size, collate_fn=collator)
    gen_dl = None
    if options.generation_metrics:
        if options.task != "seq2seq":
            raise ValueError("generation_metrics (BLEU, chrF, ROUGE) apply to task: seq2seq.")
        subset = validation
        if options.num_generation_examples is not None:
            subset = validation.take(options.num_generation_examples) if streaming else validation.select(
                range(min(options.num_generation_examples, len(validation))))
        gen_dl = DataLoader(subset, batch_size=options.per_device_eval_batch_size, collate_fn=collator)
    return train_dl, eval_dl, gen_dl, (None if streaming else len(validation))


def make_optimizer(model, options):
    """AdamW; no weight decay on 1-d parameters (biases, norms); the head's own parameters
    (not the shared embedding E) at `head_learning_rate` when it is set."""
    head = {id(p) for p in model.head.parameters()}
    groups = []
    for in_head, lr in ((False, options.learning_rate), (True, options.head_learning_rate or options.learning_rate)):
        for matrix, decay in ((True, options.weight_decay), (False, 0.0)):
            params = [p for p in model.parameters()
                      if p.requires_grad and (id(p) in head) == in_head and (p.ndim >= 2) == matrix]
            if params:
                groups.append({"params": params, "weight_decay": decay, "lr": lr})
    return torch.optim.AdamW(groups, lr=options.learning_rate, betas=(options.adam_beta1, options.adam_beta2))


def total_steps(options, train_dl) -> int:
    if options.max_steps is not None:
        return options.max_steps
    if not hasattr(train_dl, "__len__"):
        raise ValueError("A streamed dataset has no length: set max_steps.")
    return math.ceil(options.num_train_epochs * math.ceil(len(train_dl) / options.gradient_accumulation_steps))


def evaluate_all(accelerator, model, eval_dl, gen_dl, tokenizer, options, final: bool = False) -> dict:
    results = evaluate_perplexity(accelerator, model, eval_dl, options.task)
    if gen_dl is not None:
        sources, predictions, references = generate_texts(accelerator, model, gen_dl, tokenizer, options)
        results["eval_generated"] = len(predictions)
        if accelerator.is_main_process:
            results.update(generation_scores(options.generation_metrics, predictions, references))
            if final:
                results["samples"] = [{"source": s, "prediction": p, "reference": r}
                                      for s, p, r in list(zip(sources, predictions, references))[:5]]
    return results


def accelerator_for(options) -> Accelerator:
    project = ProjectConfiguration(project_dir=options.output_dir, automatic_checkpoint_naming=True,
                                   total_limit=options.save_total_limit)
    log_with = trackers(options.report_to)
    accelerator = Accelerator(
        gradient_accumulation_steps=options.gradient_accumulation_steps, mixed_precision=options.mixed_precision,
        project_config=project, log_with=log_with or None,
        dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True),
    )
    if log_with:
        accelerator.init_trackers("train", config={k: v for k, v in vars(options).items()
                                                   if isinstance(v, (int, float, str, bool))})
    return accelerator


def micro_step(accelerator, model, optimizer, scheduler, batch, options):
    """Forward and backward of one micro-batch; the optimizer steps when accumulation is complete."""
    with accelerator.accumulate(model):
        outputs = model(**batch)  # the loss includes the head's auxiliary loss (DOC), if any
        accelerator.backward(outputs.loss)
        if accelerator.sync_gradients and options.max_grad_norm:
            accelerator.clip_grad_norm_(model.parameters(), options.max_grad_norm)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
    return outputs


class RunningLoss:
    """Mean training loss (and auxiliary loss, when the head has one) since the last log."""

    def __init__(self, accumulation: int):
        self.accumulation, self.loss, self.aux, self.steps, self.has_aux = accumulation, 0.0, 0.0, 0, False

    def add(self, outputs) -> None:
        self.loss += outputs.loss.item() / self.accumulation
        if outputs.aux_loss is not None:
            self.has_aux, self.aux = True, self.aux + outputs.aux_loss.item() / self.accumulation

    def record(self, learning_rate: float) -> dict:
        record = {"train_loss": self.loss / self.steps, "learning_rate": learning_rate}
        if self.has_aux:
            record["train_aux_loss"] = self.aux / self.steps
        self.loss, self.aux, self.steps = 0.0, 0.0, 0
        return record


def epoch_batches(accelerator, train_dl, progress):
    """This epoch's batches in the seeded order, minus those a resumed run already saw."""
    if hasattr(train_dl, "set_epoch"):
        train_dl.set_epoch(progress.epoch)
    if progress.batches_in_epoch:
        return accelerator.skip_first_batches(train_dl, progress.batches_in_epoch)
    return train_dl


def train_loop(accelerator, options, model, optimizer, scheduler, train_dl, hooks, log, progress, max_steps):
    """Train until max_steps; returns (interrupted by stop_after_steps, seconds per optimizer step)."""
    bar = tqdm(total=max_steps, initial=progress.step, disable=not accelerator.is_local_main_process, desc="train")
    running, step_times, started = RunningLoss(options.gradient_accumulation_steps), [], time.perf_counter()
    while progress.step < max_steps:
        for batch in epoch_batches(accelerator, train_dl, progress):
            running.add(micro_step(accelerator, model, optimizer, scheduler, batch, options))
            progress.batches_in_epoch += 1
            if not accelerator.sync_gradients:
                continue
            progress.step, running.steps = progress.step + 1, running.steps + 1
            step_times.append(time.perf_counter() - started)
            bar.update(1)
            if progress.step % options.logging_steps == 0 or progress.step == max_steps:
                record = running.record(scheduler.get_last_lr()[0])
                log.log(record, progress.step)
                bar.set_postfix(loss=f"{record['train_loss']:.3f}")
            for every, hook in hooks:  # periodic evaluation, code-table re-assignment
                if every and progress.step % every == 0 and progress.step < max_steps:
                    log.log({**hook(), "train_seconds": sum(step_times)}, progress.step)
            stop = options.stop_after_steps is not None and progress.step >= options.stop_after_steps
            if (options.save_steps and progress.step % options.save_steps == 0) or stop:
                accelerator.save_state()
            if stop or progress.step >= max_steps:
                bar.close()
                return stop, step_times
            started = time.perf_counter()
        progress.epoch, progress.batches_in_epoch = progress.epoch + 1, 0
    bar.close()
    return False, step_times


def resume_if_any(accelerator, options) -> None:
    latest = checkpoint_to_resume(options.output_dir, "auto")
    if latest is not None:  # the next automatic checkpoint needs a new number, or save_state refuses
        accelerator.project_configuration.iteration = checkpoint_number(latest) + 1
    checkpoint = checkpoint_to_resume(options.output_dir, options.resume)
    if checkpoint is not None:
        accelerator.load_state(str(checkpoint))
        accelerator.print(f"Resumed from {checkpoint}")


def prepare_run(options) -> SimpleNamespace:
    """Accelerator, data, tokenizer, model, optimizer and schedule, prepared; resumed from the
    latest checkpoint when there is one."""
    os.makedirs(options.output_dir, exist_ok=True)
    accelerator = accelerator_for(options)
    set_seed(options.seed)
    resuming = checkpoint_to_resume(options.output_dir, options.resume) is not None
    with accelerator.main_process_first():
        train_split, validation_split = data_lib.select_splits(data_lib.load_raw(options), options)
    tokenizer = get_tokenizer(accelerator, options, train_split, resuming)
    train_dl, eval_dl, gen_dl, n_validation = get_dataloaders(accelerator, options, tokenizer, train_split, validation_split)
    model = build_model(options, tokenizer)
    model.head.set_word_counts(torch.as_tensor(data_lib.word_counts(train_dl.dataset, model.config.vocab_size)))
    if tokenizer.pad_token_id is not None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
    if options.gradient_checkpointing:
        (getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable)()
    counts, optimizer, max_steps = parameter_counts(model), make_optimizer(model, options), total_steps(options, train_dl)
    scheduler = get_scheduler(options.lr_scheduler_type, optimizer,  # accelerate steps it once per process
                              num_warmup_steps=options.warmup_steps * accelerator.num_processes,
                              num_training_steps=max_steps * accelerator.num_processes)
    model, optimizer, train_dl, eval_dl, scheduler = accelerator.prepare(model, optimizer, train_dl, eval_dl, scheduler)
    gen_dl = accelerator.prepare(gen_dl) if gen_dl is not None else None
    progress, log = Progress(), MetricsLog(accelerator, options.output_dir)
    accelerator.register_for_checkpointing(progress)
    resume_if_any(accelerator, options)
    log.truncate_after(progress.step if progress.step else -1)  # a fresh run starts a fresh log
    if progress.step == 0:
        log.log({"event": "start", **counts, "num_processes": accelerator.num_processes,
                 "validation_examples": n_validation, "max_steps": max_steps}, 0)
    return SimpleNamespace(**locals())


def final_results(run, step_times) -> dict:
    options, accelerator = run.options, run.accelerator
    results = evaluate_all(accelerator, run.model, run.eval_dl, run.gen_dl, run.tokenizer, options, final=True)
    results.update(run.counts, validation_examples=run.n_validation,
                   train_step_time_s=sum(step_times[1:]) / max(len(step_times) - 1, 1))  # the first step warms up
    if options.task == "causal_lm" and accelerator.is_main_process:
        prompt = options.sample_prompt or next(iter(run.validation_split))[options.text_column][:40]
        results["sample"] = sample_text(run.model, run.tokenizer, prompt, options.sample_max_new_tokens, options.seed)
    return results


def code_table_hook(accelerator, model, options) -> tuple:
    """(interval, hook) re-assigning a learnt word-to-code table (HybridLightRNN-style heads,
    capability `learns_code_table`); costs are summed over processes by the head. Costs
    accumulated since the last re-assignment are not checkpointed."""
    head = accelerator.unwrap_model(model).head
    every = options.eval_steps if options.code_reassign_steps is None else options.code_reassign_steps
    if not getattr(head, "learns_code_table", False) or not every:  # 0: a fixed table, no costs tracked
        return None, None
    head.track_code_costs(True)
    return every, lambda: {f"code_{k}": v for k, v in head.reassign_codes().items()}


def training_function(options) -> dict:
    run = prepare_run(options)
    accelerator = run.accelerator

    def evaluate():
        return evaluate_all(accelerator, run.model, run.eval_dl, run.gen_dl, run.tokenizer, options)

    interrupted, step_times = train_loop(accelerator, options, run.model, run.optimizer, run.scheduler, run.train_dl,
                                         [(options.eval_steps, evaluate), code_table_hook(accelerator, run.model, options)],
                                         run.log, run.progress, run.max_steps)
    if interrupted:
        accelerator.print(f"Stopped after step {run.progress.step} (stop_after_steps); run again to resume.")
        accelerator.end_training()
        return {"interrupted": True, "step": run.progress.step}
    results = final_results(run, step_times)
    run.log.log({"event": "final", "train_seconds": sum(step_times),
                 **{k: v for k, v in results.items() if k not in ("samples", "sample")}}, run.progress.step)
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        finish_run(accelerator.unwrap_model(run.model), run.tokenizer, options, results)
    accelerator.wait_for_everyone()
    accelerator.end_training()
    return results


def main(argv=None):
    options = parse_args(argv)
    training_function(options)


if __name__ == "__main__":
    main()
