"""The training loop: optimizer steps over windows of `gradient_accumulation_steps` micro-batches.

Each window's loss is the token mean over the whole window (and over every process), as
transformers' Trainer computes it: the model gets `num_items_in_batch`, the window's label
tokens summed over processes, and returns `sum of NLL / num_items_in_batch` per micro-batch.
A head's auxiliary loss (DOC) enters `loss` weighted by the micro-batch's share of the window's
tokens (the model does this given `num_items_in_batch`), so the window trains on its token-weighted
mean, as under Trainer; a head's further token sums in `loss` (`mtp`'s future tokens) count as the
NLL does. The auxiliary loss and the named parts (`aux_terms`) are logged as window means.
The micro-batches accumulate through `accelerator.accumulate` (gradient synchronisation on the
window's last micro-batch; under DeepSpeed, its engine's own accumulation and step). accelerate
and DeepSpeed divide each micro-batch's loss by `gradient_accumulation_steps` (a mean of
micro-batch means); a token mean needs the window's label count instead, so the loss handed to
`accelerator.backward` is multiplied back by that step count.

No step waits for the device: the losses are summed on it (`RunningLoss`) and the non-finite
check is recorded on it (`NonFiniteWatch`); both are read, and summed over processes, only at
a logging step, before a checkpoint or an evaluation, and at the end. A non-finite loss or
gradient norm still stops the run naming its first step, and nothing from that step on is saved.
The batches' ids and labels are checked on the host where they are built (`batches.CheckedCollator`),
not in the step; one process reduces nothing (`accelerator.reduce` would copy each value).

A step's time is the wall time from its start to the start of the next one, evaluations, head
updates, checkpoints and callbacks left out: the host runs ahead of the device, so it waits for it
at the reads of a logging step, and that wait is counted in the step that reads, so that the times
add up to the device's (`throughput.training_rates`).
"""

from __future__ import annotations

import contextlib
import time
from itertools import islice

import torch
from tqdm.auto import tqdm

from hf_outheads import IGNORE_INDEX, next_token_labels

from hf_outheads.training.checkpoints import complete_checkpoints
from hf_outheads.training.safeguards import NonFiniteError


def loss_tokens(batch, task: str) -> torch.Tensor:
    """Label tokens the model scores (a causal LM predicts token t + 1 at position t)."""
    labels = next_token_labels(batch["labels"]) if task == "causal_lm" else batch["labels"]
    return (labels != IGNORE_INDEX).sum()


def window_step(accelerator, model, optimizer, scheduler, window: list, options, watch, terms: dict | None = None
                ) -> tuple:
    """Forward and backward of every micro-batch of `window`, then one optimizer step. Returns
    (the window's mean token NLL over all processes, the mean auxiliary loss or None) as 0-d
    tensors on the device, not read; the loss and the gradient norm are handed to `watch`. `terms`,
    when given, receives the window's mean of each named part of the head's extra terms
    (`outputs.aux_terms`), on the device too."""
    processes, nll_total, aux_total = accelerator.num_processes, 0.0, None
    reduce = accelerator.reduce if processes > 1 else (lambda tensor, reduction: tensor)
    count = reduce(sum(loss_tokens(b, options.model.task) for b in window).to(accelerator.device), "sum")
    undo_division = accelerator.gradient_accumulation_steps  # see the module docstring
    for batch in window:  # accelerate synchronises (and steps) on the last: the window ends an accumulation
        with accelerator.accumulate(model):
            outputs = model(**batch, num_items_in_batch=count)
            nll, aux = outputs.nll_loss, outputs.aux_loss  # nll: this process's share of the window's token mean
            # every term of `loss` is this process's share of the window's value; processes' gradients are averaged
            accelerator.backward(outputs.loss * processes * undo_division)
            limit = options.training.max_grad_norm
            if accelerator.sync_gradients and limit:
                watch.add("gradient norm", accelerator.clip_grad_norm_(model.parameters(), limit))
            optimizer.step()  # accelerate's wrappers step (and zero) on the synchronising micro-batch only
            scheduler.step()
            optimizer.zero_grad()
        nll_total += nll.detach()
        if aux is not None:
            aux_total = aux.detach() / len(window) + (0.0 if aux_total is None else aux_total)
        for name, value in (getattr(outputs, "aux_terms", None) or {}).items() if terms is not None else ():
            terms[name] = value.detach() / len(window) + terms.get(name, 0.0)
    nll_total = reduce(nll_total, "sum")  # the same value on every process
    watch.add("training loss", nll_total)
    for name, value in (terms or {}).items():
        terms[name] = reduce(value, "mean")
    return nll_total, None if aux_total is None else reduce(aux_total, "mean")


class RunningLoss:
    """Mean training loss (and auxiliary loss and the named parts of a head's extra terms, when the
    head has them) since the last log, summed on the device; `record` reads it."""

    def __init__(self):
        self.loss, self.aux, self.steps, self.terms = 0.0, None, 0, {}

    def add(self, loss: torch.Tensor, aux: torch.Tensor | None, terms: dict | None = None) -> None:
        self.loss, self.steps = self.loss + loss, self.steps + 1
        if aux is not None:
            self.aux = aux if self.aux is None else self.aux + aux
        for name, value in (terms or {}).items():
            self.terms[name] = value + self.terms.get(name, 0.0)

    def record(self, learning_rate: float) -> dict:
        record = {"train_loss": float(self.loss) / self.steps, "learning_rate": learning_rate}
        if self.aux is not None:
            record["train_aux_loss"] = float(self.aux) / self.steps
        record.update({f"train_{name}": float(value) / self.steps for name, value in self.terms.items()})
        self.loss, self.aux, self.steps, self.terms = 0.0, None, 0, {}
        return record


class NonFiniteWatch:
    """The first optimizer step whose training loss or gradient norm was NaN or infinite, kept
    on the device (no host sync per step); `check` reads it and raises `NonFiniteError`."""

    WHAT = ("training loss", "gradient norm")

    def __init__(self, device):
        self.first = torch.zeros(3, dtype=torch.float32, device=device)  # step (0: none), which, value
        self.step = 0

    def add(self, what: str, value) -> None:
        if value is None:  # a gradient norm DeepSpeed does not return
            return
        value = torch.as_tensor(value, device=self.first.device).detach().float()
        new = torch.stack([value.new_full((), self.step), value.new_full((), self.WHAT.index(what)), value])  # no copy from the host
        self.first.copy_(torch.where((self.first[0] == 0) & ~value.isfinite(), new, self.first))

    def check(self) -> None:
        step, which, value = self.first.tolist()
        if step:
            error = NonFiniteError(f"the {self.WHAT[int(which)]} is {value}")
            error.step = int(step)
            raise error


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
def stop_on_non_finite(options):
    """Turn a `NonFiniteError` of an optimizer step (`error.step`, `NonFiniteWatch`) into one naming
    the step, the last good checkpoint and what to change; nothing from that step on is saved."""
    try:
        yield
    except NonFiniteError as error:
        step = error.step
        found = complete_checkpoints(options.training.output_dir)
        kept = (f"The last good checkpoint, {found[-1]}, is kept: rerunning with --resume auto continues from it"
                if found else "No checkpoint had been saved yet")
        raise NonFiniteError(
            f"Training stopped at optimizer step {step}: {error} (not finite). Nothing from this step on was saved. "
            f"{kept}. Lower learning_rate (now {options.training.learning_rate}), keep max_grad_norm set (now "
            f"{options.training.max_grad_norm}), or train in float32 / bf16 rather than fp16.") from None


def train_loop(accelerator, options, model, optimizer, scheduler, train_dl, hooks, log, progress, max_steps, save,
               callbacks=()):
    """Train until max_steps; returns (interrupted by stop_after_steps, seconds per optimizer step).
    The model trains in training mode, as Trainer's does (a converted pretrained model comes in eval
    mode, as from_pretrained gives it; in eval mode its loss would lack the head's training terms).
    `stop_after_steps` interrupts only a run that started below it, so rerunning finishes. Each of
    `callbacks` is called after every optimizer step as `callback(progress, step_times)`, with
    host values only (no device read); it may end the run by raising, and nothing more is saved."""
    model.train()
    bar = tqdm(total=max_steps, initial=progress.step, disable=not accelerator.is_local_main_process, desc="train")
    running, step_times, started = RunningLoss(), [], time.perf_counter()
    watch = NonFiniteWatch(accelerator.device)
    stop_at = options.training.stop_after_steps if (options.training.stop_after_steps or 0) > progress.step else None
    while progress.step < max_steps:
        whole_epoch, trained = progress.batches_in_epoch == 0, False
        for window in epoch_windows(accelerator, train_dl, progress, options.training.gradient_accumulation_steps):
            trained = True
            watch.step = progress.step + 1
            terms = {}
            running.add(*window_step(accelerator, model, optimizer, scheduler, window, options, watch, terms), terms)
            progress.batches_in_epoch += len(window)
            progress.step += 1
            bar.update(1)
            stop = stop_at is not None and progress.step >= stop_at
            save_now = (options.training.save_steps and progress.step % options.training.save_steps == 0) or stop
            hooks_now = [hook for every, hook in hooks if every and progress.step % every == 0 and progress.step < max_steps]
            logging_now = progress.step % options.training.logging_steps == 0 or progress.step == max_steps
            if logging_now or save_now or hooks_now:  # the one host sync: nothing non-finite is logged, saved or evaluated
                with stop_on_non_finite(options):
                    watch.check()
            if logging_now:
                record = running.record(scheduler.get_last_lr()[0])
                log.log(record, progress.step)
                bar.set_postfix(loss=f"{record['train_loss']:.3f}")
            step_times.append(time.perf_counter() - started)  # (with the wait for the device at a read)
            for hook in hooks_now:  # periodic evaluation, the head's periodic update
                log.log({**hook(), "train_seconds": sum(step_times)}, progress.step)
            if save_now:
                save()
            for callback in callbacks:
                callback(progress, step_times)
            if stop or progress.step >= max_steps:
                bar.close()
                return stop, step_times
            started = time.perf_counter()
        if whole_epoch and not trained:  # a streamed training set shorter than a full batch (torch_compile)
            raise ValueError("An epoch of the training data gave no batch: it has fewer examples than one batch.")
        progress.epoch, progress.batches_in_epoch = progress.epoch + 1, 0
    bar.close()
    return False, step_times
