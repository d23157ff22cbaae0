"""`OutHeadsForCausalLM` / `OutHeadsForSeq2SeqLM`: any transformers backbone
(`AutoModel.from_config(config.text_config)`) with a swappable output head.

The classes only use the head interface of `head_interface.py`; they never look at the head's name.
`forward` reads no value back from the device (no check of ids or labels there, as transformers'
models: a collator checks a training batch on the host, `model_io.check_labels`); `generate`
checks its prompt's ids once per call.
"""

from __future__ import annotations

import torch
from transformers import AutoModel, AutoModelForCausalLM, AutoModelForSeq2SeqLM, GenerationMixin, PreTrainedModel
from transformers.models.auto import modeling_auto
from transformers.utils import logging
from transformers.utils.generic import can_return_tuple

from .configuration_outheads import OutHeadsConfig
from .head_catalog import get_head_class
from .backbones import cache_name, head_dims
from .compat import CACHE, PARTIAL_HIDDEN_STATES, backbone_kwargs, slice_logits_to_keep, takes_cache
from .head_interface import IGNORE_INDEX, HeadInputs, OutputHead, next_token_labels
from .model_io import (PACKAGE, LibraryHooks, OutHeadsCausalLMOutput, OutHeadsSeq2SeqLMOutput, check_backbone_kind,
                       check_token_ids, effective_embedding_weight, embedding_rows, fused_outputs, model_tags,
                       package_tool, shift_right)

logger = logging.get_logger(__name__)


class OutHeadsPreTrainedModel(LibraryHooks, PreTrainedModel):
    config_class = OutHeadsConfig
    base_model_prefix = "backbone"
    supports_gradient_checkpointing = True
    _supports_sdpa = True
    _supports_flash_attn = True
    _supports_flex_attn = True
    _supports_attention_backend = True

    def __init__(self, config: OutHeadsConfig):
        options = config.resolved_head_options  # a config without a backbone (text_config) or with bad options fails here
        check_backbone_kind(type(self), config)  # AutoModelForCausalLM on a seq2seq folder (or the reverse) fails here
        super().__init__(config)
        self.backbone = AutoModel.from_config(config.text_config)
        head_class = config.head_class  # the class the options belong to: no second lookup
        if not issubclass(head_class, OutputHead):  # remote code: the config's modules are another copy than these
            head_class = get_head_class(config.head_type)
        with torch.random.fork_rng(devices=[]):  # see _init_weights
            self.head: OutputHead = head_class(options, head_dims(config.text_config))
        self._check_backbone_shapes()
        self.bind_head_embeddings()  # a head reading E shows it as its `weight` (tied, for FSDP's wrap)
        # remote code: AutoModel resolves to this class too (register_for_auto_class takes one)
        config.auto_map = {**(getattr(config, "auto_map", None) or {}), "AutoModel": f"modeling_outheads.{type(self).__name__}"}
        self.post_init()
        self.add_model_tags(model_tags(config))  # into the cards Trainer.push_to_hub and TRL write

    def _check_backbone_shapes(self) -> None:
        """The (decoder) input embedding is the `(vocab_size, d)` matrix the head's sizes come from, or a
        ValueError naming the family: some embed more tokens than the `vocab_size` words their LM head scores
        (CPM-Ant's prompt tokens, Moshi's padding token), and every head here scores each row of `E`."""
        dims, table = self.head.dims, self.output_embedding_matrix()
        shape = tuple(getattr(table, "ds_shape", table.shape))  # DeepSpeed ZeRO-3 (zero.Init): partitioned, shape (0,)
        rows, width = shape[0], shape[-1]
        family = f"The '{self.config.text_config.model_type}' backbone ({type(self.backbone).__name__})"
        if rows != dims.vocab_size:
            raise ValueError(
                f"{family} embeds {rows} tokens where its config's vocab_size, the words the family's LM head scores, "
                f"is {dims.vocab_size}: every hf_outheads head scores each row of the input embedding, so none "
                "computes this family's logits.")
        if width != dims.embed_dim:
            raise ValueError(f"{family} embeds tokens in {width} dimensions where its config gives {dims.embed_dim} "
                             "(hidden_size or its embedding width): no hf_outheads head reads this embedding.")

    def _init_weights(self, module):
        """The head initialises on a fork of the global random state, so the backbone's init
        and the training randomness after it are the same whatever the head."""
        if isinstance(module, OutputHead):
            with torch.random.fork_rng(devices=[]):
                module.reset_parameters()

    def output_embedding_matrix(self) -> torch.Tensor:
        """`E`: the input embedding matrix of the (decoder) backbone, `|V| x d`, as the backbone
        uses it: with the contribution of adapters on the embedding module (PEFT LoRA on
        `embed_tokens`) while they are not merged (`model_io.effective_embedding_weight`)."""
        return effective_embedding_weight(self.backbone.get_decoder().get_input_embeddings())

    @classmethod
    def from_backbone(cls, pretrained, head_type: str | None = None, head_options=None, **kwargs):
        """Wrap a pretrained transformers LM (Hub id, local path or loaded model) with a head.

        `head_type=None` keeps the original head's form (`tied`, `linear`; an `hf_outheads` model
        is returned as it is), so the logits are exactly the original's. Other heads start from
        the original LM head where their form allows it (see each head's `init_from_lm_head`).
        `head_options`: a dict for `head_type`, or the head's options object, which names its head
        (`head_type` may then be omitted); an `hf_outheads` model of that head asked for no
        options (None, `{}`, an options object at its defaults) is returned as it is.
        `kwargs` go to the original model's `from_pretrained` (e.g. `dtype`, `revision`).
        """
        return package_tool("conversion").convert_pretrained(cls, pretrained, head_type, head_options, **kwargs)

    @classmethod
    def from_pretrained(cls, *args, **kwargs):
        """As `PreTrainedModel.from_pretrained`, but a checkpoint that misses weights, has
        weights this model lacks (another head type) or, without `ignore_mismatched_sizes`,
        has mis-shaped ones is an error, never a silent random initialisation. With
        `output_loading_info=True` the caller gets the missing and unexpected keys instead (as
        transformers returns them), and the model as loaded."""
        want_info = kwargs.pop("output_loading_info", False)
        allow_mismatch = kwargs.pop("ignore_mismatched_sizes", False)
        model, info = super().from_pretrained(*args, output_loading_info=True, ignore_mismatched_sizes=True, **kwargs)
        keys = ("missing_keys", "unexpected_keys") + (() if allow_mismatch else ("mismatched_keys",))
        problems = {key: sorted(info.get(key) or (), key=str) for key in keys}
        problems = {key: value for key, value in problems.items() if value}
        if want_info:  # the caller reads missing / unexpected keys; mis-shaped ones stay an error
            problems = {key: value for key, value in problems.items() if key == "mismatched_keys"}
        if problems:
            raise ValueError(
                f"The checkpoint does not match {cls.__name__} (head '{model.config.head_type}'): {problems}. "
                "Save it with this package's save_pretrained, or convert a plain model with from_backbone()."
            )
        model.head.check_state()  # loaded values the head needs consistent (lightrnn's code table)
        return (model, info) if want_info else model

    def _supports_default_dynamic_cache(self) -> bool:
        """transformers tells the families that bring a cache of their own (MiniMax, RWKV, xLSTM, ...) by the
        model class's name: here the backbone's."""
        return GenerationMixin._supports_default_dynamic_cache.__func__(type(self.backbone))

    def generate(self, *args, **kwargs):
        """`GenerationMixin.generate` inside `head.generation_scope()` (e.g. one label matrix per call);
        the prompt's ids are checked first (a seq2seq encoder runs outside `forward`)."""
        prompt = kwargs.get("input_ids", args[0] if args and isinstance(args[0], torch.Tensor) else None)
        check_token_ids(prompt, embedding_rows(self.get_input_embeddings()))
        with self.head.generation_scope():
            return super().generate(*args, **kwargs)

    def _get_candidate_generator(self, generation_config, input_ids, inputs_tensor, logits_processor, model_kwargs,
                                 *args, **kwargs):
        """`generate(..., use_mtp=True)`: transformers' assisted decoding with the candidate generator
        of the head (`head.candidate_generator`: drafts from the head's future-token predictors, verified
        by the next-token head in one forward with the KV cache); otherwise transformers' own choice.
        A prompt given as `inputs_embeds` reaches the drafts as the rows of the positions before
        `input_ids` (which then hold the generated tokens alone)."""
        if generation_config.use_mtp:
            embeds = None if self.config.is_encoder_decoder else model_kwargs.get("inputs_embeds")
            prompt_embeds = None if embeds is None else embeds[:, : embeds.shape[1] - input_ids.shape[1]]
            return self.head.candidate_generator(self, generation_config, logits_processor, prompt_embeds)
        return super()._get_candidate_generator(generation_config, input_ids, inputs_tensor, logits_processor,
                                                model_kwargs, *args, **kwargs)

    def _head_outputs(
        self, last_hidden, hidden_states, labels, logits_to_keep, num_items_in_batch=None, return_logits=None,
        token_ids=None,
    ):
        """Run the head on the kept positions; return (loss, nll_loss, logits, aux_loss, aux_terms).
        In training, `loss` = `nll_loss` (the token-mean NLL) + the head's `extra_nll_sum` over the same
        count (`mtp`'s future tokens, the z-loss) + `aux_loss` (a per-micro-batch training term, DOC's),
        weighted by this batch's share of `num_items_in_batch` when that is given: summed over a window's
        micro-batches and processes as Trainer and `hf_outheads/training/train.py` sum the losses, it counts
        once (a token-weighted mean), not once per micro-batch and process. Outside training (`eval()`)
        `loss` is `nll_loss` alone, so that `exp(loss)` is the perplexity (Trainer's `eval_loss`, as
        `hf_outheads/training/evaluation.py` computes it); `aux_terms` still names the extra terms' parts (`mtp_nll_k`).
        `return_logits` (forward argument): None lets the head decide
        (mixture heads return `logits=None` when training with labels), True always computes logits,
        False skips them when labels are given. `token_ids`: the (decoder) input ids, or None."""
        if labels is None:
            self._warn_if_training_without_labels()
        hidden = slice_logits_to_keep(last_hidden, logits_to_keep) * self.config.hidden_scale
        # in the final state's dtype: hidden_states[0] of most backbones is `inputs_embeds` as the caller gave it
        # (bf16 rows into an fp32 model), which the backbone's first layer promotes but a head's map would not
        layers = {i: slice_logits_to_keep(hidden_states[i], logits_to_keep).to(hidden.dtype)
                  for i in self.head.layer_indices}
        if labels is not None:
            labels = slice_logits_to_keep(labels.unsqueeze(-1), logits_to_keep).squeeze(-1).to(hidden.device)
        if token_ids is not None:
            token_ids = slice_logits_to_keep(token_ids.unsqueeze(-1), logits_to_keep).squeeze(-1).to(hidden.device)
        inputs = HeadInputs(hidden, self.output_embedding_matrix(), layers, return_logits=return_logits,
                            token_ids=token_ids)
        out = self.head(inputs, labels)
        loss = nll = None
        if labels is not None:
            tokens = (labels != IGNORE_INDEX).sum()
            count = tokens if num_items_in_batch is None else num_items_in_batch
            count = torch.as_tensor(count, device=out.nll_sum.device).clamp_min(1)  # no label: 0
            loss = nll = out.nll_sum / count
            if self.training and out.extra_nll_sum is not None:
                loss = loss + out.extra_nll_sum / count
            if self.training and out.aux_loss is not None:  # a per-micro-batch term: this batch's share of the count
                loss = loss + out.aux_loss * (tokens / count)
        return loss, nll, out.logits, out.aux_loss, out.aux_terms

    def _warn_if_training_without_labels(self) -> None:
        """Once per process, as transformers warns: a training forward (gradients on) without labels,
        for a head whose training terms need them (`head.unlabelled_training_loss`). Trainer calls the
        model so when `label_smoothing_factor` > 0 (or with a `compute_loss_func`): it takes the labels
        out of the batch and computes the next-token loss from the logits alone."""
        missed = self.head.unlabelled_training_loss
        if missed and self.training and torch.is_grad_enabled():
            logger.warning_once(
                f"Head '{self.config.head_type}' ran a training forward without labels: {missed}. Trainer takes "
                "the labels out of the batch when label_smoothing_factor > 0 (or a compute_loss_func is given) and "
                "computes the next-token loss from the logits alone; with label_smoothing_factor=0 the model gets "
                "them.")

    def _fused_head_outputs(self, last_hidden, hidden_states, labels, shift_labels, num_items_in_batch, token_ids=None):
        """TRL's fused-LM-head call (`fused_lm_head=True`): per-token log-probabilities of the
        next-token labels, entropy, ... through the head (`model_io.fused_outputs`), at the
        temperature of TRL's patch (`model_io.LibraryHooks.__setattr__`)."""
        if shift_labels is None:
            if labels is None:
                raise ValueError("fused_lm_head=True needs labels (or shift_labels).")
            shift_labels = next_token_labels(labels)
        loss, nll, logits, _, _ = self._head_outputs(last_hidden, hidden_states, shift_labels, 0, num_items_in_batch, True,
                                                     token_ids)
        extra = None if loss is nll else loss - nll  # the head's training terms beside the next-token NLL
        temperature = getattr(self, "_fused_lm_head", {}).get("temperature", 1.0)
        keep = slice(None) if labels is None else slice(None, -1)  # (batch, seq_len - 1) as TRL's
        shift_labels = shift_labels.to(logits.device)
        return fused_outputs(logits[:, keep], shift_labels[:, keep], temperature, num_items_in_batch, extra)

    def _needs_hidden_states(self, output_hidden_states):
        """(what to ask the backbone for, what to return to the caller): booleans, or for a list
        of layer indices (transformers' partial capture; an int is a list of one) the indices to ask
        (the caller's and the head's `layer_indices`) and the set of indices to return. The last
        entry alone (`-1`, what transformers' MTP and this package's drafting ask for at every step)
        is the backbone's final state, which every forward has: the backbone captures nothing then."""
        wanted = self.config.output_hidden_states if output_hidden_states is None else output_hidden_states
        layers = self.head.layer_indices
        if isinstance(wanted, int) and not isinstance(wanted, bool):
            wanted = [wanted]
        if isinstance(wanted, (list, tuple)):
            count = self.head.dims.num_layers + 1  # hidden_states entries: embeddings + every layer
            keep = {index % count for index in wanted}
            if keep == {count - 1} and not layers:
                return False, keep
            return (sorted(keep | set(layers)) if PARTIAL_HIDDEN_STATES else True), keep
        return bool(wanted) or bool(layers), bool(wanted)

    def _returned_hidden_states(self, hidden_states, keep, last_hidden):
        if not keep or keep is True:
            return hidden_states if keep else None
        if hidden_states is None:  # the last entry alone: the final state (see `_needs_hidden_states`)
            return (None,) * self.head.dims.num_layers + (last_hidden,)
        return tuple(state if i in keep else None for i, state in enumerate(hidden_states))


class OutHeadsForCausalLM(OutHeadsPreTrainedModel, GenerationMixin):
    """A decoder-only backbone (GPT-2, Llama, Qwen2, Mistral, ...) with an output head."""

    encoder_decoder = False  # the backbone kind this class runs (model_io.check_backbone_kind)

    def prepare_inputs_for_generation(self, input_ids, next_sequence_length=None, inputs_embeds=None, **kwargs):
        """`GenerationMixin`'s, with the whole sequence at every step for a backbone without a cache
        (`backbones.CACHE_NAMES`), as its family's own model does. (`inputs_embeds` named: transformers
        reads this signature to tell that a prompt given as embeddings reaches `forward`.)"""
        if cache_name(self.config.text_config) is None:
            next_sequence_length = None
        return super().prepare_inputs_for_generation(input_ids, next_sequence_length=next_sequence_length,
                                                     inputs_embeds=inputs_embeds, **kwargs)

    @takes_cache  # also as `past_key_values`, the name before transformers 5.24 (compat.py)
    @can_return_tuple  # return_dict=False: a tuple, as transformers' models
    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        position_ids=None,
        cache=None,
        inputs_embeds=None,
        labels=None,
        use_cache=None,
        output_hidden_states=None,
        logits_to_keep: int | torch.Tensor = 0,
        return_logits: bool | None = None,
        fused_lm_head: bool = False,
        **kwargs,
    ) -> OutHeadsCausalLMOutput:
        """`labels` are the input ids (shifted here); `shift_labels` are already shifted (label of
        position t = token t + 1), as transformers' causal LMs accept them: in `kwargs`, as theirs, so
        that Trainer's label names (every forward parameter named `*label*`) are `["labels"]`.
        `fused_lm_head=True`: TRL's per-token outputs instead (`model_io.FusedLMHeadOutput`). `cache`
        (taken and returned) is the backbone's cache under the family's own name (`backbones.CACHE_NAMES`:
        RWKV's recurrent `state`; None for a family without one), so that `generate` carries it."""
        ask_hidden, return_hidden = self._needs_hidden_states(output_hidden_states)
        num_items_in_batch, shift_labels = kwargs.pop("num_items_in_batch", None), kwargs.pop("shift_labels", None)
        cache_key = cache_name(self.config.text_config)  # (RWKV's recurrent state is its `state`)
        outputs = self.backbone(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            use_cache=use_cache,
            output_hidden_states=ask_hidden,
            return_dict=True,
            **({cache_key: cache} if cache_key else {}),
            **backbone_kwargs(kwargs),
        )
        if fused_lm_head:
            return self._fused_head_outputs(
                outputs.last_hidden_state, outputs.hidden_states, labels, shift_labels, num_items_in_batch, input_ids
            )
        if shift_labels is not None:
            labels = shift_labels
        elif labels is not None:
            labels = next_token_labels(labels)
        loss, nll_loss, logits, aux_loss, aux_terms = self._head_outputs(
            outputs.last_hidden_state, outputs.hidden_states, labels, logits_to_keep, num_items_in_batch, return_logits,
            input_ids,
        )
        return OutHeadsCausalLMOutput(
            loss=loss,
            nll_loss=nll_loss,
            aux_loss=aux_loss,
            aux_terms=aux_terms,
            logits=logits,
            **{CACHE: getattr(outputs, cache_key, None) if cache_key else None},
            hidden_states=self._returned_hidden_states(outputs.hidden_states, return_hidden, outputs.last_hidden_state),
            attentions=getattr(outputs, "attentions", None),
        )


class OutHeadsForSeq2SeqLM(OutHeadsPreTrainedModel, GenerationMixin):
    """An encoder-decoder backbone (T5, BART, Marian, ...) with an output head on the decoder."""

    encoder_decoder = True

    def prepare_decoder_input_ids_from_labels(self, labels: torch.Tensor) -> torch.Tensor:
        text = self.config.text_config
        return shift_right(labels, text.decoder_start_token_id, text.pad_token_id)

    @takes_cache  # also as `past_key_values`, the name before transformers 5.24 (compat.py)
    @can_return_tuple  # return_dict=False: a tuple, as transformers' models
    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        decoder_input_ids=None,
        decoder_attention_mask=None,
        encoder_outputs=None,
        cache=None,
        inputs_embeds=None,
        decoder_inputs_embeds=None,
        labels=None,
        use_cache=None,
        output_hidden_states=None,
        logits_to_keep: int | torch.Tensor = 0,
        return_logits: bool | None = None,
        **kwargs,
    ) -> OutHeadsSeq2SeqLMOutput:
        ask_hidden, return_hidden = self._needs_hidden_states(output_hidden_states)
        num_items_in_batch = kwargs.pop("num_items_in_batch", None)
        if labels is not None and decoder_input_ids is None and decoder_inputs_embeds is None:
            decoder_input_ids = self.prepare_decoder_input_ids_from_labels(labels)
        outputs = self.backbone(
            input_ids=input_ids,
            attention_mask=attention_mask,
            decoder_input_ids=decoder_input_ids,
            decoder_attention_mask=decoder_attention_mask,
            encoder_outputs=encoder_outputs,
            **{CACHE: cache},
            inputs_embeds=inputs_embeds,
            decoder_inputs_embeds=decoder_inputs_embeds,
            use_cache=use_cache,
            output_hidden_states=ask_hidden,
            return_dict=True,
            **backbone_kwargs(kwargs),
        )
        loss, nll_loss, logits, aux_loss, aux_terms = self._head_outputs(
            outputs.last_hidden_state, outputs.decoder_hidden_states, labels, logits_to_keep, num_items_in_batch,
            return_logits, decoder_input_ids,
        )
        return OutHeadsSeq2SeqLMOutput(
            loss=loss,
            nll_loss=nll_loss,
            aux_loss=aux_loss,
            aux_terms=aux_terms,
            logits=logits,
            **{CACHE: getattr(outputs, CACHE)},
            decoder_hidden_states=self._returned_hidden_states(outputs.decoder_hidden_states, return_hidden,
                                                               outputs.last_hidden_state),
            decoder_attentions=outputs.decoder_attentions,
            cross_attentions=outputs.cross_attentions,
            encoder_last_hidden_state=outputs.encoder_last_hidden_state,
            encoder_hidden_states=outputs.encoder_hidden_states,
            encoder_attentions=outputs.encoder_attentions,
        )


OutHeadsConfig.register_for_auto_class()
OutHeadsForCausalLM.register_for_auto_class("AutoModelForCausalLM")
OutHeadsForSeq2SeqLM.register_for_auto_class("AutoModelForSeq2SeqLM")


def register_auto_classes() -> None:
    """Register the model classes with `AutoModel`, `AutoModelForCausalLM` and `AutoModelForSeq2SeqLM`
    (`configuration_outheads` registered the config with `AutoConfig` when imported)."""
    AutoModel.register(OutHeadsConfig, (OutHeadsForCausalLM, OutHeadsForSeq2SeqLM), exist_ok=True)
    AutoModelForCausalLM.register(OutHeadsConfig, OutHeadsForCausalLM, exist_ok=True)
    AutoModelForSeq2SeqLM.register(OutHeadsConfig, OutHeadsForSeq2SeqLM, exist_ok=True)
    # the task tables transformers reads by model type or class name (register() fills neither): the
    # text-generation pipeline's model check, and the task Trainer's model card infers (`modelcard.TASK_MAPPING`)
    modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.setdefault(OutHeadsConfig.model_type, "OutHeadsForCausalLM")
    modeling_auto.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES.setdefault(OutHeadsConfig.model_type, "OutHeadsForSeq2SeqLM")


if __package__ == PACKAGE:  # the installed package registers; remote code's copy does not (transformers maps it itself)
    register_auto_classes()
