"""Checks of a training run's options before any work starts (`train.parse_args`), so that a
wrong option fails with one message once the script is imported, not after the data is tokenised:

- the output folder: never one the run reads from (`check_output_dir`, `hf_outheads.tools.folders`);
- the backbone: exactly one of `model_preset` (a known preset that fits the task) and
  `pretrained` (whose config loads), and a tokenizer that can serve it (`auto` needs a pretrained
  model); lengths (`block_size`, ...) within its positions (`modeling.check_backbone`,
  `modeling.check_lengths`, which `build_model` does not repeat); a preset's head options
  against its sizes, from its config, and its backbone's layers built on the meta device with the
  run's `model_overrides` (`check_preset_model`);
- a loss kernel the head options name: installed and able to run on this machine (`check_loss_kernel`);
- generation metrics that exist, for a seq2seq run;
- a learning-rate schedule that builds with its `lr_scheduler_kwargs` (`check_schedule`);
- the checkpoint the run would resume (`resume: auto` finds the latest in output_dir): one
  written for another head type or backbone family is refused here, naming both, and so is one
  trained with other options than the run gives but for those that may change on resume
  (`checkpoints.resume_changes`). What only the built model shows (head options, vocabulary,
  shapes) is still checked when the checkpoint is loaded (`checkpoints.check_identity`);
- `push_to_hub`: the Hub reachable with a token (`check_hub`), not found out after training;
- the trackers of `report_to`: installed (`tracking.chosen_trackers`, which names the pip package);
- the launch: FSDP asked for on a machine without accelerator (`launching.check_sharding`) stops
  before an output folder is made.
"""

from __future__ import annotations

import copy
import json

from huggingface_hub.errors import StrictDataclassError
from transformers import AutoConfig

from hf_outheads.tools.folders import check_target
from hf_outheads.loss_kernels import PEER_KERNELS, unavailable

from hf_outheads.training.checkpoints import MARKER, checkpoint_to_resume, resume_changes
from hf_outheads.training.evaluation import METRIC_KEYS
from hf_outheads.training.launching import check_sharding, has_accelerator, with_launch_precision
from hf_outheads.training.modeling import PRESETS, check_backbone, check_lengths
from hf_outheads.training.tokenization import TRAINABLE
from hf_outheads.training.tracking import chosen_trackers


def check_tokenizer(options) -> None:
    """A tokenizer that can serve the backbone: `auto` needs a pretrained model, and a trained BPE
    no larger than a preset's overridden vocabulary."""
    model = options.model
    vocab = model.model_overrides.get("vocab_size")
    if model.model_preset and isinstance(vocab, int) and model.tokenizer == "bpe" \
            and vocab < model.tokenizer_vocab_size:
        raise ValueError(f"model_overrides.vocab_size = {vocab} is smaller than the tokenizer it trains "
                         f"(tokenizer_vocab_size = {model.tokenizer_vocab_size}): ids from {vocab} on would have no "
                         "embedding. Drop vocab_size from model_overrides (the tokenizer's size is the default) or raise it.")
    if model.tokenizer == "auto" and not model.pretrained:
        raise ValueError("tokenizer: auto needs a pretrained model; use tokenizer: bpe / wordlevel or a tokenizer path.")


def run_sources(options) -> list[str]:
    """The local paths a run reads besides its config: the pretrained model, a tokenizer folder,
    the data files."""
    model = options.model
    files = [path for paths in options.data.data_files.values() for path in (paths if isinstance(paths, list) else [paths])]
    tokenizer = model.tokenizer if model.tokenizer not in ("auto", *TRAINABLE) else None
    return [str(path) for path in (model.pretrained, tokenizer, *files) if path is not None]


def check_output_dir(options) -> None:
    """The output_dir is not, does not contain and does not lie inside what the run reads."""
    check_target(options.training.output_dir, run_sources(options), what="output_dir")


def planned_text_config(options):
    """The backbone config the run builds, without the tokenizer's sizes and ids: a preset's, or
    the pretrained model's (a folder, an hf_outheads one too: `.modeling` imports the config, which
    registers itself; or a Hub id, its config fetched now, so that a wrong one is refused now)."""
    if options.model.model_preset:
        config = AutoConfig.for_model(PRESETS[options.model.model_preset][0], **PRESETS[options.model.model_preset][1])
    else:
        try:
            config = AutoConfig.from_pretrained(options.model.pretrained).get_text_config()
        except (OSError, ValueError) as error:  # no such folder or Hub id, no network, a broken config.json
            raise ValueError(f"Option pretrained={options.model.pretrained!r}: its config cannot be loaded "
                             f"({brief(error)}).") from None
    try:
        for key, value in options.model.model_overrides.items():  # the config's fields are typed (strict dataclasses)
            setattr(config, key, value)
    except (ValueError, TypeError, StrictDataclassError) as error:
        raise ValueError(f"Option model_overrides={options.model.model_overrides!r}: {brief(error)}") from None
    return config


def brief(error: BaseException, limit: int = 300) -> str:
    """`error`'s message as one line (whitespace collapsed), at most about `limit` characters."""
    text = " ".join(str(error).split()) or type(error).__name__
    return text if len(text) <= limit else text[:limit] + " ..."


def check_preset_model(options, text_config) -> None:
    """A preset's model builds with these options: its head's options resolve for its sizes
    (`text_config` with the trained tokenizer's vocabulary), which its config does
    (`OutHeadsConfig.resolved_head_options`), and its backbone builds (what transformers checks as it
    builds the layers, e.g. heads that divide the width) on the meta device: nothing allocated."""
    if not options.model.model_preset:
        return
    import torch
    from transformers import AutoModel

    from hf_outheads import OutHeadsConfig

    config = copy.deepcopy(text_config)
    if options.model.tokenizer in TRAINABLE and "vocab_size" not in options.model.model_overrides:
        config.vocab_size = options.model.tokenizer_vocab_size
    try:
        OutHeadsConfig(text_config=config, head_options=options.model.head.options)
        with torch.device("meta"):
            AutoModel.from_config(config)
    except (ValueError, TypeError, StrictDataclassError) as error:
        raise ValueError(f"The {options.model.model_preset} model cannot be built with these options: "
                         f"{brief(error)}") from None


def planned_backbone(options) -> str:
    """The backbone family (`model_type`) the run builds."""
    return planned_text_config(options).model_type


def check_loss_kernel(options) -> None:
    """Every fused-loss kernel the head options name (`loss_kernel`, the shared head's too) can run
    on this machine, rather than failing at the first training step."""
    device = "cuda" if has_accelerator() else "cpu"
    head = options.model.head
    named, todo = [], [head.spelt_out()] if head.head_type else []
    while todo:  # options, and the options of a head they hold (`mtp`'s shared head)
        values = todo.pop()
        named += [values["loss_kernel"]] if "loss_kernel" in values else []
        todo += [value for value in values.values() if isinstance(value, dict)]
    for kernel in named:
        why = unavailable(kernel, device) if kernel in PEER_KERNELS else None
        if why:
            raise ValueError(f"Option head_options: the loss kernel {kernel!r} cannot run here: {why}. Use "
                             "loss_kernel 'auto' (the fastest kernel installed) or 'own'.")


def check_generation_metrics(options) -> None:
    """Generation metrics are modules shipped in hf_outheads/training/metrics (`evaluation.METRIC_KEYS`), for a seq2seq run."""
    unknown = sorted(set(options.training.generation_metrics) - set(METRIC_KEYS))
    if unknown:
        raise ValueError(f"Option generation_metrics: unknown metric(s) {unknown}. Valid metrics: {sorted(METRIC_KEYS)}.")
    if options.training.generation_metrics and options.model.task != "seq2seq":
        raise ValueError("Option generation_metrics (BLEU, chrF, ROUGE) applies to task: seq2seq.")


def check_schedule(options) -> None:
    """`lr_scheduler_type` builds with `lr_scheduler_kwargs` (e.g. cosine_with_min_lr needs min_lr_rate or
    min_lr), on a stand-in optimizer."""
    import torch
    from transformers import get_scheduler

    training = options.training
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=training.learning_rate)
    try:
        get_scheduler(training.lr_scheduler_type, optimizer, num_warmup_steps=training.warmup_steps,
                      num_training_steps=training.max_steps or 1, scheduler_specific_kwargs=training.lr_scheduler_kwargs or None)
    except (TypeError, ValueError) as error:
        raise ValueError(f"Option lr_scheduler_kwargs={training.lr_scheduler_kwargs!r} does not fit lr_scheduler_type="
                         f"{training.lr_scheduler_type}: {brief(error)}") from None


def check_checkpoint(options) -> None:
    """Refuse the checkpoint `options.training.resume` points at when it was written for another head
    type or backbone family, or trained with options the run may not change on resume."""
    checkpoint = checkpoint_to_resume(options.training.output_dir, options.training.resume)
    if checkpoint is None:
        return
    saved = json.loads((checkpoint / MARKER).read_text()).get("model", {})
    planned = {"head_type": options.model.head.head_type, "backbone": planned_backbone(options)}
    different = [key for key, value in planned.items() if None not in (value, saved.get(key)) and value != saved[key]]
    if different:
        describe = lambda model: f"head '{model.get('head_type')}' on a {model.get('backbone') or '?'} backbone"
        raise ValueError(
            f"The checkpoint {checkpoint} belongs to another model: it was written for {describe(saved)}, this run "
            f"builds {describe(planned)}. Start fresh with --resume never (the old checkpoints are then replaced), "
            "or use another --output_dir.")
    resume_changes(checkpoint, with_launch_precision(options)[0], options.model.head.head_class)


def check_hub(options) -> None:
    """`push_to_hub` needs the Hub: not offline, a token, and the Hub reachable with it, checked
    before training rather than after it."""
    if not options.training.push_to_hub:
        return
    from huggingface_hub import HfApi, constants, get_token

    dry_run = ("To train now and publish later, drop --push_to_hub: the run writes the card it would push to "
               f"{options.training.output_dir}/README.md (its usage code names --hub_model_id when given), and "
               f"`hf upload <repo_id> {options.training.output_dir} --exclude 'checkpoints/*'` uploads it once the Hub is reachable.")
    if constants.is_offline_mode():
        raise ValueError(f"push_to_hub needs the Hub, and HF_HUB_OFFLINE is set. {dry_run}")
    if not get_token():
        raise ValueError(f"push_to_hub needs a Hub token: run `hf auth login` or set HF_TOKEN. {dry_run}")
    try:
        HfApi().whoami()
    except Exception as error:  # noqa: BLE001: no network, a refused token, ...
        raise ValueError(f"push_to_hub: the Hub cannot be reached with this token ({type(error).__name__}: "
                         f"{str(error).splitlines()[0] if str(error) else ''}). {dry_run}") from None


def check_run(options) -> None:
    check_sharding()
    check_output_dir(options)
    check_backbone(options)
    check_tokenizer(options)
    planned = planned_text_config(options)
    check_lengths(options, planned)
    check_preset_model(options, planned)
    check_loss_kernel(options)
    check_generation_metrics(options)
    check_schedule(options)
    check_checkpoint(options)
    check_hub(options)
    chosen_trackers(options.training.report_to)  # a tracker that is not installed, named with its pip package
