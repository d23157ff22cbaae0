"""What differs between the transformers versions the package supports (pyproject.toml's floor to the newest),
in one place: each name as transformers 5.24 and later spell it, and what the package uses before that.
The current API is used wherever the installed transformers has it.

| what                       | 5.24 and later                          | before 5.24 (from 5.19)                     |
| the models' cache argument | `cache` (and the outputs' field)        | `past_key_values`                           |
| an optional sub-config     | `sub_configs_defaults` + `SubConfigSpec` | `sub_configs` (the config builds the dict) |
| `slice_logits_to_keep`     | `transformers.modeling_utils`'s          | the same slicing, here                     |
| checkpointing's switches   | `activation_checkpointing_enable`, ...   | `gradient_checkpointing_enable`, ...       |
| `output_hidden_states=[i]` | indices into the full `hidden_states`    | other indices (no embedding entry): unused |
| continuous batching        | the paged cache is the model's `cache`    | its paged cache is an attention `cache`    |
"""

from __future__ import annotations

import functools

import torch
from transformers import configuration_utils, modeling_utils
from transformers.modeling_outputs import CausalLMOutputWithPast
from transformers.utils import output_capturing
from transformers.utils.deprecation import deprecate_kwarg

# the name under which transformers' models take and return their cache
CACHE = "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"

# how a composite config declares an optional sub-config with a default family (None: `sub_configs` instead)
SubConfigSpec = getattr(configuration_utils, "SubConfigSpec", None)

# a model's activation (gradient) checkpointing: (switch it on, switch it off, the flag that says it is on)
CHECKPOINTING = (("activation_checkpointing_enable", "activation_checkpointing_disable", "is_activation_checkpointing")
                 if hasattr(modeling_utils.PreTrainedModel, "activation_checkpointing_enable") else
                 ("gradient_checkpointing_enable", "gradient_checkpointing_disable", "is_gradient_checkpointing"))
# its `TrainingArguments` field (`activation_checkpointing` from 5.24, `gradient_checkpointing` before)
CHECKPOINTING_ARGUMENT = CHECKPOINTING[0].removesuffix("_enable")

# `output_hidden_states=[indices]` captures those entries of the full `hidden_states` (0: the embedding output); before
# 5.24 its indices skip the embedding output, so the model asks for every entry there and returns the chosen ones
PARTIAL_HIDDEN_STATES = hasattr(output_capturing, "resolve_hidden_states_indices")


# before 5.24, what the model hands its backbone as `cache` (an attention argument there): continuous batching's
# paged cache, which transformers' continuous batching passes to the model as `cache`
ATTENTION_CACHE = "_attention_cache"


def takes_cache(forward):
    """`forward`, whose parameter is `cache`, also called by the names transformers passes: where `cache` is
    transformers' name, its old name `past_key_values` is deprecated as transformers' models deprecate it.
    Before 5.24 `generate` passes `past_key_values`, renamed here without a warning, and continuous batching
    passes its paged cache as `cache`, kept for the backbone's attention (`backbone_kwargs`)."""
    if CACHE == "cache":
        return deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")(forward)
    from transformers.generation.continuous_batching.cache import PagedAttentionCache

    @functools.wraps(forward)
    def renamed(*args, **kwargs):
        if isinstance(kwargs.get("cache"), PagedAttentionCache):
            kwargs[ATTENTION_CACHE] = kwargs.pop("cache")
        if "past_key_values" in kwargs:
            kwargs["cache"] = kwargs.pop("past_key_values")
        return forward(*args, **kwargs)

    return renamed


def backbone_kwargs(kwargs: dict) -> dict:
    """The forward's further keyword arguments as the backbone takes them (`takes_cache`'s paged cache as `cache`)."""
    return {("cache" if key == ATTENTION_CACHE else key): value for key, value in kwargs.items()}


def _slice_logits_to_keep(hidden_states: torch.Tensor, logits_to_keep: int | torch.Tensor) -> torch.Tensor:
    """The positions of `(batch, seq_len, width)` to score, as transformers 5.24's function picks them: the last
    `logits_to_keep` (an int; 0 keeps all), a 1D tensor's positions, a 2D integer tensor's positions per row, or a
    boolean `(batch, seq_len)` mask's (flattened to `(count, width)`)."""
    if isinstance(logits_to_keep, torch.Tensor) and logits_to_keep.ndim == 2:
        if logits_to_keep.dtype == torch.bool:
            return hidden_states[logits_to_keep]
        return torch.take_along_dim(hidden_states, logits_to_keep[..., None], dim=1)
    if isinstance(logits_to_keep, int):
        logits_to_keep = slice(-logits_to_keep, None)
    return hidden_states[:, logits_to_keep, :]


slice_logits_to_keep = getattr(modeling_utils, "slice_logits_to_keep", _slice_logits_to_keep)
