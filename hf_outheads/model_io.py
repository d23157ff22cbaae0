"""What the `OutHeadsFor*` model classes need beside their `forward`, whatever the head: their
output classes, decoder inputs from labels, the checks of token ids and labels and of a config's
backbone kind, the card tags, the hooks through which libraries meet the head, and the one door to
the package's tools.

1. TRL's fused LM head. TRL's trainers (SFT, DPO, GRPO, KTO, RLOO) call
   `trl.trainer.utils.add_fused_lm_head(model, temperature=..., outputs=...)`, which replaces
   `model.forward` by a function that, called with `fused_lm_head=True`, runs `model.base_model`
   and multiplies its last hidden state by `model.get_output_embeddings().weight`: the LM head of
   a plain transformers model. An output head is not `W h + b` (a mixture, a label encoder, a
   hidden-state scale), so that function would bypass the head. The `OutHeadsFor*` classes answer
   the same call themselves, through the head (`fused_outputs` below), and keep their own
   `forward` when a replacement that takes `fused_lm_head` is assigned (`is_fused_lm_head_patch`);
   the patch's `temperature` is kept (`fused_lm_head_settings`). No import of TRL or PEFT: only
   the conventions they follow.

2. Adapters on the input embeddings (PEFT LoRA on `wte` / `embed_tokens`, ...). Heads read the
   embedding matrix `E` directly, not through the embedding module's forward. A wrapped module
   (PEFT's convention: `get_base_layer()`) adds its adapters' contribution in its forward only,
   so `effective_embedding_weight` reads `E` as the backbone sees it: the base weight plus what
   the wrapper adds to each row, i.e. what `merge_and_unload()` would write into the weight.

3. The tools. A saved folder carries the runtime alone (what loading, `forward` and `generate`
   need: transformers' remote code copies the files the model and config import); conversion
   (`from_backbone`), the plain export, model cards, the save's staging and the saved folder's code
   files are the installed package's tools (`hf_outheads/tools/`), reached at call time through
   `package_tool` (importlib, not an import statement: transformers requires every package a copied
   file imports by statement).
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
from dataclasses import dataclass

import torch
from transformers.modeling_outputs import CausalLMOutputWithPast, Seq2SeqLMOutput
from transformers.utils import ModelOutput, logging

from .head_interface import IGNORE_INDEX, OutputHead

logger = logging.get_logger(__name__)

PACKAGE = "hf_outheads"  # the installed package (remote code loads the saved files under another name)


def package_tool(name: str, required: bool = True):
    """The installed package's tool `name`, the module `hf_outheads.tools.<name>` (`conversion`,
    `export_plain`, `model_card`, `folders`, the GPU kernels `softmax_kernels`): what a saved folder
    does not carry. The runtime's one way to a tool: no runtime file imports one by statement.
    Without the package (a saved folder's remote code alone): an ImportError saying to install it,
    or None when not `required`."""
    try:
        installed = importlib.util.find_spec(PACKAGE) is not None
    except ImportError:  # an import hook that refuses it
        installed = False
    if installed:
        return importlib.import_module(f"{PACKAGE}.tools.{name}")
    if not required:
        return None
    raise ModuleNotFoundError(f"This needs the {PACKAGE} package ({PACKAGE}.tools.{name}), which a saved model's "
                              f"remote code does not carry: pip install {PACKAGE}", name=PACKAGE)


@dataclass
class OutHeadsCausalLMOutput(CausalLMOutputWithPast):
    """`CausalLMOutputWithPast` whose `logits` are the head's next-token scores or, where the head's class sets
    `returns_log_probs` (the mixtures `mos` and `doc`, and `lightrnn`), normalised log-probabilities, which
    `softmax` and `log_softmax` give back unchanged; compare two models' `logits` after `log_softmax`.
    Plus terms of `loss`: `nll_loss`, the token-mean next-token NLL, and `aux_loss`,
    a head's per-micro-batch training term (DOC's regulariser; None for most heads); in training `loss` also
    holds a head's further token-mean terms (`mtp`'s future tokens), whose parts `aux_terms` names for logging
    (`{"mtp_nll_1": ...}`; None for most heads). Outside training `loss` is `nll_loss`."""

    nll_loss: torch.Tensor | None = None
    aux_loss: torch.Tensor | None = None
    aux_terms: dict[str, torch.Tensor] | None = None


@dataclass
class OutHeadsSeq2SeqLMOutput(Seq2SeqLMOutput):
    """`Seq2SeqLMOutput` plus `nll_loss`, `aux_loss` and `aux_terms`, its `logits` as `OutHeadsCausalLMOutput`'s."""

    nll_loss: torch.Tensor | None = None
    aux_loss: torch.Tensor | None = None
    aux_terms: dict[str, torch.Tensor] | None = None


def shift_right(labels: torch.Tensor, decoder_start_token_id: int, pad_token_id: int) -> torch.Tensor:
    """Decoder inputs from labels (`-100` becomes padding), as BART and T5 do it."""
    if decoder_start_token_id is None or pad_token_id is None:
        raise ValueError("Set decoder_start_token_id and pad_token_id on the config to train from labels.")
    shifted = labels.new_full(labels.shape, decoder_start_token_id)
    shifted[:, 1:] = labels[:, :-1]
    return shifted.masked_fill(shifted == IGNORE_INDEX, pad_token_id)


def check_labels(labels: torch.Tensor, vocab_size: int) -> None:
    """Every label is -100 (ignored) or a word id in [0, vocab_size): the check of labels on the host,
    where a batch is built (a collator), never in `forward`: reading its result from a device would
    wait for the device at every step (transformers' models check neither ids nor labels there)."""
    bad = (labels != IGNORE_INDEX) & ((labels < 0) | (labels >= vocab_size))
    if bad.any():
        raise ValueError(
            f"labels must be -100 (ignored) or a token id in [0, {vocab_size}); got {labels[bad][:5].tolist()}. "
            "Mask padding with -100, and check the tokenizer matches the model's vocabulary."
        )


def embedding_rows(embedding) -> int:
    """Rows of an input embedding module, also when an adapter wraps it (PEFT: `get_base_layer()`)."""
    return (embedding.get_base_layer() if hasattr(embedding, "get_base_layer") else embedding).num_embeddings


def check_token_ids(ids: torch.Tensor | None, vocab_size: int, name: str = "input_ids") -> None:
    """Every input id is in [0, vocab_size): an id the embedding lacks (a tokenizer larger than
    the model) is a ValueError naming it, not the embedding's bare IndexError (or a CUDA device-side
    assert). One min/max reduction and one device-to-host copy: `generate` calls it once per call;
    `forward` never does (a device read at every step); skipped while torch.compile traces."""
    if ids is None or ids.numel() == 0 or torch.compiler.is_compiling():
        return
    low, high = torch.stack(torch.aminmax(ids)).tolist()
    bad = high if high >= vocab_size else (low if low < 0 else None)
    if bad is not None:
        raise ValueError(
            f"{name} holds the token id {bad}, outside the model's vocabulary of {vocab_size} ids (0 to {vocab_size - 1}): "
            "the tokenizer has more tokens than the model has embeddings. Use the tokenizer the model was trained "
            "with, or grow the model with model.resize_token_embeddings(len(tokenizer)) (and train the new rows)."
        )


def check_backbone_kind(model_class, config) -> None:
    """`model_class` (its `encoder_decoder` attribute) suits the config's backbone: the causal LM
    class on an encoder-decoder backbone (or the reverse) would build, then fail at its first
    forward; transformers' Auto classes cannot tell, since both classes share `OutHeadsConfig`."""
    text = config.text_config
    is_encoder_decoder = bool(getattr(text, "is_encoder_decoder", False))
    if is_encoder_decoder == model_class.encoder_decoder:
        return
    kind, right, auto = (("an encoder-decoder", "OutHeadsForSeq2SeqLM", "AutoModelForSeq2SeqLM") if is_encoder_decoder
                         else ("a decoder-only", "OutHeadsForCausalLM", "AutoModelForCausalLM"))
    raise ValueError(f"This model's backbone (`{text.model_type}`) is {kind} model, which {model_class.__name__} "
                     f"cannot run: load it with {right} (or {auto}).")


def paper_tags(head_class: type[OutputHead]) -> list[str]:
    """`arxiv:<id>` tags of the papers of `head_class` (its `papers`), which the Hub links to the
    paper pages."""
    return [f"arxiv:{paper.arxiv}" for paper in head_class.papers if paper.arxiv]


def model_tags(config) -> list[str]:
    """Tags of every card of an `OutHeadsFor*` model (also `model.model_tags`, which
    `Trainer.push_to_hub` and TRL's trainers put in the cards they write): the package, the
    head, the backbone family, remote code and the head's papers."""
    tags = [PACKAGE, f"outheads-{config.head_type}", config.text_config.model_type, "custom_code"]
    return tags + paper_tags(config.head_class)


@dataclass
class FusedLMHeadOutput(ModelOutput):
    """The fields of TRL's `FusedCausalLMOutput`, computed through the head. Per-token fields
    have the labels' shape (`(batch, seq_len - 1)`, or `(batch, seq_len)` with `shift_labels`)
    and are zero where the label is -100; `loss` is the mean negative log-likelihood under
    the temperature-scaled distribution plus the head's `aux_loss` (DOC's regulariser)."""

    loss: torch.Tensor | None = None
    log_probs: torch.Tensor | None = None
    entropy: torch.Tensor | None = None
    log_sum_sq_probs: torch.Tensor | None = None
    mean_logits: torch.Tensor | None = None
    is_top1: torch.Tensor | None = None
    label_mask: torch.Tensor | None = None
    aux_loss: torch.Tensor | None = None


def fused_outputs(logits, labels, temperature=1.0, num_items_in_batch=None, aux_loss=None) -> FusedLMHeadOutput:
    """Per-token statistics of the next-token distributions `softmax(logits / temperature)`
    (`logits`: scores, or log-probabilities for heads that return them; both give the same
    distribution) at the positions of `labels` (same leading shape)."""
    mask = labels != IGNORE_INDEX
    scores = logits.float() / temperature
    log_p = scores.log_softmax(-1)
    gold = labels.clamp(min=0).unsqueeze(-1)
    log_probs = log_p.gather(-1, gold).squeeze(-1).masked_fill(~mask, 0.0)
    entropy = -(log_p.exp() * log_p).sum(-1).masked_fill(~mask, 0.0)
    with torch.no_grad():
        log_sum_sq = torch.logsumexp(2 * log_p, dim=-1).masked_fill(~mask, 0.0)
        finite = torch.where(torch.isfinite(scores), scores, torch.zeros_like(scores))  # masked codes: -inf scores
        mean_logits = finite.mean(-1).masked_fill(~mask, 0.0)
        is_top1 = (log_p.argmax(-1) == labels) & mask
    count = mask.sum() if num_items_in_batch is None else num_items_in_batch
    loss = -log_probs.sum() / torch.as_tensor(count, device=log_probs.device).clamp(min=1)
    if aux_loss is not None:
        loss = loss + aux_loss
    return FusedLMHeadOutput(loss=loss, log_probs=log_probs, entropy=entropy, log_sum_sq_probs=log_sum_sq,
                             mean_logits=mean_logits, is_top1=is_top1, label_mask=mask, aux_loss=aux_loss)


def is_fused_lm_head_patch(model, value) -> bool:
    """`value`, being assigned to `model.forward`, is a fused-LM-head forward bound to `model`
    (it takes a `fused_lm_head` keyword) other than the class's own."""
    func = getattr(value, "__func__", None)
    if func is None or getattr(value, "__self__", None) is not model or func is type(model).forward:
        return False
    try:
        parameters = inspect.signature(func, follow_wrapped=False).parameters
    except (TypeError, ValueError):
        return False
    return "fused_lm_head" in parameters


# The contract with TRL's `trl.trainer.utils.add_fused_lm_head(model, temperature=...)` (TRL 1.x),
# which `tests/test_trl_peft.py::test_trl_keeps_the_fused_lm_head_contract` checks against the
# installed TRL, so that a TRL release that changes it fails the suite instead of training silently
# at another temperature:
#   1. it assigns `model.forward` a function bound to the model whose signature takes the keyword
#      `fused_lm_head` (its documented call: `model(..., labels=labels, fused_lm_head=True)`);
#   2. that function reads its temperature from the enclosing call's argument named `temperature`
#      (a free variable of that name).
TRL_TEMPERATURE_NAME = "temperature"


def fused_lm_head_settings(value) -> dict:
    """The `temperature` the patch was made with (`add_fused_lm_head(model, temperature=...)`),
    read as the TRL contract above says; 1.0 (with a warning) when the patch breaks it."""
    code, cells = value.__func__.__code__, value.__func__.__closure__ or ()
    names = dict(zip(code.co_freevars, cells))
    temperature = names[TRL_TEMPERATURE_NAME].cell_contents if TRL_TEMPERATURE_NAME in names else None
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)):
        logger.warning("A fused-LM-head forward (TRL's add_fused_lm_head) was assigned whose temperature could not "
                       "be read (no '%s' captured); the head's fused outputs use temperature 1.0.", TRL_TEMPERATURE_NAME)
        return {"temperature": 1.0}
    return {"temperature": float(temperature)}


def effective_embedding_weight(module: torch.nn.Module) -> torch.Tensor:
    """The `|V| x d` table `module` embeds with: `module.weight`, or for a module wrapped by
    adapters (it has `get_base_layer()`), the base weight plus the rows the wrapper adds in its
    forward (`module(ids) - base(ids)`: exact for any adapter, and zero when the adapters are
    disabled or merged). Gradients reach the adapters' parameters."""
    get_base = getattr(module, "get_base_layer", None)
    base = get_base() if callable(get_base) else module
    if base is module:
        return module.weight
    ids = torch.arange(base.weight.shape[0], device=base.weight.device)
    return base.weight + (module(ids) - base(ids)).to(base.weight.dtype)


class LibraryHooks:
    """The `OutHeadsFor*` methods that libraries call on a model's output layer: the output
    embeddings (the head), recognising TRL's fused LM head, resizing, saving, the Hub model card and
    the plain export (the last three through the package's tools, `package_tool`). Mixed into
    `OutHeadsPreTrainedModel` before `PreTrainedModel`; besides `PreTrainedModel`'s methods it reads
    only the attributes declared here. (The fused call itself, which runs the head, is the model's:
    `OutHeadsPreTrainedModel._fused_head_outputs`.)"""

    head: OutputHead  # the output head
    backbone: torch.nn.Module  # the transformers backbone (`AutoModel`)

    def _initialize_weights(self, module, is_custom_code: bool = False):
        """As transformers', except that a head without parameters of its own (`bilinear` or
        `drill` with `output_bias=False`: its weights are in sub-modules) still gets
        `reset_parameters`: for custom code transformers skips a module whose own parameters
        are all initialised, which such a head vacuously is. Its init goes through
        `transformers.initialization`, which leaves loaded tensors alone."""
        bare_head = isinstance(module, OutputHead) and next(module.parameters(recurse=False), None) is None
        return super()._initialize_weights(module, is_custom_code and not bare_head)

    def initialize_weights(self):
        """As transformers', also on a model whose parameters DeepSpeed ZeRO-3 partitioned as they
        were built (`deepspeed.zero.Init`, which transformers enters for the backbone whenever a
        ZeRO-3 config is active, e.g. under accelerate): the partitioned parameters are gathered
        for the initialisation and rank 0's values kept (`deepspeed.zero.GatheredParameters`, as
        transformers does when it resizes embeddings), so that an init that indexes or reshapes a
        weight (a padding row, a head's identity maps) meets the full tensor. This gathers the
        whole model once at build time; a model loaded with `from_pretrained` is not affected."""
        partitioned = [p for p in self.parameters() if hasattr(p, "ds_id") and p.numel() == 0]
        if not partitioned:
            return super().initialize_weights()
        try:  # (in a try: remote code needs no package beyond torch and transformers)
            from deepspeed.runtime.zero.partition_parameters import GatheredParameters
        except ImportError as error:  # unreachable: only DeepSpeed partitions parameters
            raise ImportError("Parameters partitioned by DeepSpeed ZeRO-3 need DeepSpeed to be gathered.") from error
        with GatheredParameters(partitioned, modifier_rank=0):
            return super().initialize_weights()

    def get_output_embeddings(self) -> OutputHead:
        """The output layer: the head, for every head type. Its scores are not `W h + b` in
        general, so it is no `nn.Linear`; what libraries do with the output layer is handled here:
        resizing (`resize_token_embeddings`), TRL's fused LM head (answered through the head, see
        `model_io`); transformers' quantizers list it among the modules not to convert; an
        adapter on the input embeddings is seen by the head, and TRL does not take it for one on
        the LM head (as it would if this returned the embedding module)."""
        return self.head

    def set_output_embeddings(self, new_embeddings):
        if not isinstance(new_embeddings, OutputHead):
            raise TypeError(f"The output layer of {type(self).__name__} is an OutputHead (model.head); "
                            f"got {type(new_embeddings).__name__}.")
        self.head = new_embeddings

    def __setattr__(self, name, value):
        """Keep the class's `forward` when TRL's `add_fused_lm_head` replaces it: the replacement
        would score `last_hidden_state @ lm_head.weight`, bypassing the head; `forward` answers
        `fused_lm_head=True` through the head instead (see the module docstring)."""
        if name == "forward" and is_fused_lm_head_patch(self, value):
            self._fused_lm_head = fused_lm_head_settings(value)
            return
        super().__setattr__(name, value)

    def bind_head_embeddings(self) -> None:
        """Give the head the (decoder) input embedding module, whose weight is `E`: a head that
        reads `E` shows it as its `weight` (`head_interface.TiedToEmbeddings`), so that
        libraries treat `E` and the head as a tied pair (accelerate's FSDP2 wrap: one group)."""
        self.head.bind_input_embeddings(self.backbone.get_decoder().get_input_embeddings())

    def set_input_embeddings(self, value):
        super().set_input_embeddings(value)
        self.bind_head_embeddings()

    def _resize_token_embeddings(self, new_num_tokens, pad_to_multiple_of=None, mean_resizing=True):
        """The backbone's input embeddings only; the output layer (the head) is resized by
        `resize_token_embeddings` through `head.resize_vocab`, not as an `nn.Linear`."""
        old_embeddings = self.get_input_embeddings()
        new_embeddings = self._get_resized_embeddings(old_embeddings, new_num_tokens, pad_to_multiple_of, mean_resizing)
        if hasattr(old_embeddings, "_hf_hook"):  # accelerate's device placement, as transformers does
            try:  # (in a try: remote code needs no package beyond torch and transformers)
                from accelerate.hooks import add_hook_to_module
            except ImportError:  # no accelerate, no hook
                pass
            else:
                add_hook_to_module(new_embeddings, old_embeddings._hf_hook)
        new_embeddings.requires_grad_(old_embeddings.weight.requires_grad)
        self.set_input_embeddings(new_embeddings)
        return self.get_input_embeddings()

    def resize_token_embeddings(self, new_num_tokens=None, pad_to_multiple_of=None, mean_resizing=True):
        """Resize the backbone's embeddings, then the head's per-word parameters
        (`head.resize_vocab`), and keep `config.vocab_size` and `text_config.vocab_size` equal."""
        embeddings = super().resize_token_embeddings(new_num_tokens, pad_to_multiple_of, mean_resizing)
        new_size = embeddings.weight.shape[0]
        if new_size != self.head.dims.vocab_size:
            self.head.resize_vocab(new_size)
        self.config.vocab_size = self.config.text_config.vocab_size = new_size
        return embeddings

    def save_pretrained(self, save_directory, *args, **kwargs):
        """`PreTrainedModel.save_pretrained`, written to a folder inside `save_directory` first and
        moved in once complete (`folders.save_then_swap`): a save over an earlier one that fails
        half-way (a full disk) leaves the earlier one loadable. The folder's code files are the runtime
        of this model's heads alone (`folders.runtime_code_only`). A push to the Hub (its code files are
        cut before its commit: `_upload_modified_files`), a process that is not the main one, and remote
        code without the package installed (its code files are a saved folder's already) save as
        transformers does."""
        folders = package_tool("folders", required=False)
        if folders is None or kwargs.get("push_to_hub") or not kwargs.get("is_main_process", True) \
                or os.path.isfile(save_directory):
            return super().save_pretrained(save_directory, *args, **kwargs)

        def save(folder):
            super(LibraryHooks, self).save_pretrained(folder, *args, **kwargs)
            folders.runtime_code_only(folder, type(self), self.head_classes())

        folders.save_then_swap(save, save_directory, replaced=folders.package_code_files(type(self)))

    def head_classes(self) -> set[type[OutputHead]]:
        """The head classes of this model (its head's, and the heads it is made of: `mtp`'s shared head)."""
        return {type(module) for module in self.head.modules() if isinstance(module, OutputHead)}

    def create_model_card(self, repo_id: str | None = None, tags: list[str] | None = None):
        """A `huggingface_hub.ModelCard` for this model (head, backbone, usage), rendered offline from
        the package's card template (`model_card.build_model_card`)."""
        return package_tool("model_card").build_model_card(self, repo_id, tags)

    def export_plain(self, path, tokenizer=None, **kwargs):
        """Write this model as its backbone's own transformers class (`GPT2LMHeadModel`,
        `LlamaForCausalLM`, `T5ForConditionalGeneration`, ...), which loads without this package:
        see `export_plain.export_plain` for the keyword arguments and what exports exactly."""
        return package_tool("export_plain").export_plain(self, path, tokenizer, **kwargs)

    def _upload_modified_files(self, working_dir, repo_id, *args, **kwargs):
        """Hook of `push_to_hub` / `save_pretrained(push_to_hub=True)`, called after the folder
        is written and before the single commit: the code files cut to this model's runtime
        (`folders.runtime_code_only`), and transformers' generic README replaced by
        `create_model_card()` (keeping its tags). Remote code without the package uploads as
        transformers does."""
        folders = package_tool("folders", required=False)
        if folders is not None:
            from huggingface_hub import ModelCard

            folders.runtime_code_only(working_dir, type(self), self.head_classes())
            readme = os.path.join(working_dir, "README.md")
            tags = ModelCard.load(readme).data.tags if os.path.isfile(readme) else None
            self.create_model_card(repo_id, tags).save(readme)
        return super()._upload_modified_files(working_dir, repo_id, *args, **kwargs)
