"""The training loop: optimizer steps over windows of `gradient_accumulation_steps` micro-batches.

Each window's loss is the token mean over the whole window (and over every process), as
transformers' Trainer computes it: the model gets `num_items_in_batch`, the window's label
tokens summed over processes, and returns `sum of NLL / num_items_in_batch` per micro-batch.
A head's auxiliary loss (DOC) is averaged over the window's micro-batches; a head's further token
sums in `loss` (`mtp`'s future tokens) count as the NLL does; their named parts (`aux_terms`) are
averaged over the window and logged apart.
The micro-batches accumulate through `accelerator.accumulate` (gradient synchronisation on the
window's last micro-batch; under DeepSpeed, its engine's own accumulation and step). accelerate
and DeepSpeed divide each micro-batch's loss by `gradient_accumulation_steps` (a mean of
micro-batch means); a token mean needs the window's label count instead, so the loss handed to
`accelerator.backward` is multiplied back by that step count.
"""

from __future__ import annotations

import contextlib
import time
from itertools import islice

import torch
from tqdm.auto import tqdm

from hf_outheads import IGNORE_INDEX, next_token_labels

from .checkpoints import complete_checkpoints
from .safeguards import NonFiniteError, check_finite


def loss_tokens(batch, task: str) -> torch.Tensor:
    """Label tokens the model scores (a causal LM predicts token t + 1 at position t)."""
    labels = next_token_labels(batch["labels"]) if task == "causal_lm" else batch["labels"]
    return (labels != IGNORE_INDEX).sum()


def window_step(accelerator, model, optimizer, scheduler, window: list, options, terms: dict | None = None
                ) -> tuple[float, float | None]:
    """Forward and backward of every micro-batch of `window`, then one optimizer step.
    Returns (the window's mean token NLL over all processes, mean auxiliary loss or None); `terms`,
    when given, receives the mean of each named part of the auxiliary loss (`outputs.aux_terms`)."""
    count = accelerator.reduce(sum(loss_tokens(b, options.task) for b in window).to(accelerator.device), "sum")
    processes, nll_total, aux_total = accelerator.num_processes, 0.0, None
    undo_division = accelerator.gradient_accumulation_steps  # see the module docstring
    for batch in window:  # accelerate synchronises (and steps) on the last: the window ends an accumulation
        with accelerator.accumulate(model):
            outputs = model(**batch, num_items_in_batch=count)
            nll, aux = outputs.nll_loss, outputs.aux_loss  # nll: this process's share of the window's token mean
            share = outputs.loss if aux is None else outputs.loss - aux  # nll and a head's token sums (mtp's)
            # processes' gradients are averaged; the auxiliary term is a per-micro-batch mean
            accelerator.backward((share * processes + (0.0 if aux is None else aux / len(window))) * undo_division)
            if accelerator.sync_gradients and options.max_grad_norm:
                check_finite("gradient norm", accelerator.clip_grad_norm_(model.parameters(), options.max_grad_norm))
            optimizer.step()  # accelerate's wrappers step (and zero) on the synchronising micro-batch only
            scheduler.step()
            optimizer.zero_grad()
        nll_total += nll.detach()
        if aux is not None:
            aux_total = (aux_total or 0.0) + aux.detach() / len(window)
        for name, value in (getattr(outputs, "aux_terms", None) or {}).items() if terms is not None else ():
            terms[name] = terms.get(name, 0.0) + value.detach() / len(window)
    nll_total = accelerator.reduce(torch.as_tensor(nll_total, device=accelerator.device), "sum").item()
    aux_mean = None if aux_total is None else accelerator.reduce(aux_total, "mean").item()
    for name, value in (terms or {}).items():
        terms[name] = accelerator.reduce(torch.as_tensor(value, device=accelerator.device), "mean").item()
    return nll_total, aux_mean


class RunningLoss:
    """Mean training loss (and auxiliary loss and its named parts, when the head has them) since the last log."""

    def __init__(self):
        self.loss, self.aux, self.steps, self.has_aux, self.terms = 0.0, 0.0, 0, False, {}

    def add(self, loss: float, aux: float | None, terms: dict | None = None) -> None:
        self.loss, self.steps = self.loss + loss, self.steps + 1
        if aux is not None:
            self.has_aux, self.aux = True, self.aux + aux
        for name, value in (terms or {}).items():
            self.terms[name] = self.terms.get(name, 0.0) + value

    def record(self, learning_rate: float) -> dict:
        record = {"train_loss": self.loss / self.steps, "learning_rate": learning_rate}
        if self.has_aux:
            record["train_aux_loss"] = self.aux / self.steps
        record.update({f"train_{name}": value / self.steps for name, value in self.terms.items()})
        self.loss, self.aux, self.steps, self.terms = 0.0, 0.0, 0, {}
        return record


def epoch_windows(accelerator, train_dl, progress, size: int):
    """This epoch's batches in the seeded order, minus those a resumed run already saw, in
    windows of `size` micro-batches (the last one may be shorter)."""
    if hasattr(train_dl, "set_epoch"):
        train_dl.set_epoch(progress.epoch)
    batches = iter(accelerator.skip_first_batches(train_dl, progress.batches_in_epoch)
                   if progress.batches_in_epoch else train_dl)
    while window := list(islice(batches, size)):
        yield window


@contextlib.contextmanager
def stop_on_non_finite(step: int, options):
    """Turn a `NonFiniteError` of optimizer step `step` into one naming the step, the last good
    checkpoint and what to change; nothing from this step on is saved."""
    try:
        yield
    except NonFiniteError as error:
        found = complete_checkpoints(options.output_dir)
        kept = (f"The last good checkpoint, {found[-1]}, is kept: rerunning with --resume auto continues from it"
                if found else "No checkpoint had been saved yet")
        raise NonFiniteError(
            f"Training stopped at optimizer step {step}: {error} (not finite). Nothing from this step on was saved. "
            f"{kept}. Lower learning_rate (now {options.learning_rate}), keep max_grad_norm set (now "
            f"{options.max_grad_norm}), or train in float32 / bf16 rather than fp16.") from None


def train_loop(accelerator, options, model, optimizer, scheduler, train_dl, hooks, log, progress, max_steps, save):
    """Train until max_steps; returns (interrupted by stop_after_steps, seconds per optimizer step).
    `stop_after_steps` interrupts only a run that started below it, so rerunning finishes."""
    bar = tqdm(total=max_steps, initial=progress.step, disable=not accelerator.is_local_main_process, desc="train")
    running, step_times, started = RunningLoss(), [], time.perf_counter()
    stop_at = options.stop_after_steps if (options.stop_after_steps or 0) > progress.step else None
    while progress.step < max_steps:
        for window in epoch_windows(accelerator, train_dl, progress, options.gradient_accumulation_steps):
            with stop_on_non_finite(progress.step + 1, options):
                terms = {}
                loss, aux = window_step(accelerator, model, optimizer, scheduler, window, options, terms)
                check_finite("training loss", loss)
            running.add(loss, aux, terms)
            progress.batches_in_epoch += len(window)
            progress.step += 1
            step_times.append(time.perf_counter() - started)
            bar.update(1)
            if progress.step % options.logging_steps == 0 or progress.step == max_steps:
                record = running.record(scheduler.get_last_lr()[0])
                log.log(record, progress.step)
                bar.set_postfix(loss=f"{record['train_loss']:.3f}")
            for every, hook in hooks:  # periodic evaluation, the head's periodic update
                if every and progress.step % every == 0 and progress.step < max_steps:
                    log.log({**hook(), "train_seconds": sum(step_times)}, progress.step)
            stop = stop_at is not None and progress.step >= stop_at
            if (options.save_steps and progress.step % options.save_steps == 0) or stop:
                save()
            if stop or progress.step >= max_steps:
                bar.close()
                return stop, step_times
            started = time.perf_counter()
        progress.epoch, progress.batches_in_epoch = progress.epoch + 1, 0
    bar.close()
    return False, step_times
