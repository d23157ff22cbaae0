"""Checks of a training run's options before any work starts (`train.parse_args`), so that a
wrong option fails with one message once the script is imported, not after the data is tokenised:

- the backbone: exactly one of `model_preset` (a known preset that fits the task) and
  `pretrained`, and a tokenizer that can serve it (`auto` needs a pretrained model);
- the checkpoint the run would resume (`resume: auto` finds the latest in output_dir): one
  written for another head type or backbone family is refused here, naming both. What only
  the built model shows (head options, vocabulary, shapes) is still checked when the
  checkpoint is loaded (`checkpoints.check_identity`);
- `push_to_hub`: the Hub reachable with a token (`check_hub`), not found out after training;
- the launch: FSDP asked for on a machine without accelerator (`launching.check_sharding`) stops
  before an output folder is made.
"""

from __future__ import annotations

import json
import os

from transformers import AutoConfig

from .checkpoints import MARKER, checkpoint_to_resume
from .launching import check_sharding
from .modeling import PRESETS, check_backbone


def check_tokenizer(options) -> None:
    """A tokenizer that can serve the backbone: `auto` needs a pretrained model, and a trained BPE
    no larger than a preset's overridden vocabulary."""
    vocab = options.model_overrides.get("vocab_size")
    if options.model_preset and isinstance(vocab, int) and options.tokenizer == "bpe" \
            and vocab < options.tokenizer_vocab_size:
        raise ValueError(f"model_overrides.vocab_size = {vocab} is smaller than the tokenizer it trains "
                         f"(tokenizer_vocab_size = {options.tokenizer_vocab_size}): ids from {vocab} on would have no "
                         "embedding. Drop vocab_size from model_overrides (the tokenizer's size is the default) or raise it.")
    if options.tokenizer == "auto" and not options.pretrained:
        raise ValueError("tokenizer: auto needs a pretrained model; use tokenizer: bpe / wordlevel or a tokenizer path.")


def planned_backbone(options) -> str | None:
    """The backbone family (`model_type`) the run builds, when known without downloading (an
    hf_outheads folder's config: `import hf_outheads` registered it, through `.modeling`)."""
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


def check_hub(options) -> None:
    """`push_to_hub` needs the Hub: not offline, a token, and the Hub reachable with it, checked
    before training rather than after it."""
    if not options.push_to_hub:
        return
    from huggingface_hub import HfApi, constants, get_token

    dry_run = ("To train now and publish later, drop --push_to_hub: the run writes the card it would push to "
               f"{options.output_dir}/README.md (its usage code names --hub_model_id when given), and "
               f"`hf upload <repo_id> {options.output_dir} --exclude 'checkpoints/*'` uploads it once the Hub is reachable.")
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
    check_backbone(options)
    check_tokenizer(options)
    check_checkpoint(options)
    check_hub(options)
