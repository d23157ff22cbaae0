"""Checks of a training run's options before any work starts (`train.parse_args`), so that a
wrong option fails in a second with one message instead of after the data is tokenised:

- the backbone: exactly one of `model_preset` (a known preset that fits the task) and
  `pretrained`, and a tokenizer that can serve it (`auto` needs a pretrained model);
- the checkpoint the run would resume (`resume: auto` finds the latest in output_dir): one
  written for another head type or backbone family is refused here, naming both. What only
  the built model shows (head options, vocabulary, shapes) is still checked when the
  checkpoint is loaded (`checkpoints.check_identity`).
"""

from __future__ import annotations

import json
import os

from training.checkpoints import MARKER, checkpoint_to_resume


def check_backbone(options) -> None:
    from training.modeling import check_backbone as check_preset_or_pretrained

    check_preset_or_pretrained(options)
    if options.tokenizer == "auto" and not options.pretrained:
        raise ValueError("tokenizer: auto needs a pretrained model; use tokenizer: bpe / wordlevel or a tokenizer path.")


def planned_backbone(options) -> str | None:
    """The backbone family (`model_type`) the run builds, when known without downloading."""
    from transformers import AutoConfig

    import hf_outheads  # noqa: F401  (an OutHeads folder's config)
    from training.modeling import PRESETS

    if options.model_preset:
        return PRESETS[options.model_preset][0]
    if os.path.isdir(options.pretrained):
        return AutoConfig.from_pretrained(options.pretrained).get_text_config().model_type
    return None


def check_checkpoint(options) -> None:
    """Refuse the checkpoint `options.resume` points at when it was written for another head
    type or backbone family."""
    checkpoint = checkpoint_to_resume(options.output_dir, options.resume)
    if checkpoint is None:
        return
    saved = json.loads((checkpoint / MARKER).read_text()).get("model", {})
    planned = {"head_type": options.head_spec().head_type, "backbone": planned_backbone(options)}
    different = [key for key, value in planned.items() if None not in (value, saved.get(key)) and value != saved[key]]
    if different:
        describe = lambda model: f"head '{model.get('head_type')}' on a {model.get('backbone') or '?'} backbone"
        raise ValueError(
            f"The checkpoint {checkpoint} belongs to another model: it was written for {describe(saved)}, this run "
            f"builds {describe(planned)}. Start fresh with --resume never (the old checkpoints are then replaced), "
            "or use another --output_dir.")


def check_run(options) -> None:
    check_backbone(options)
    check_checkpoint(options)
