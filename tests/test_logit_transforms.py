"""The heads' logit transforms (`logit_transforms`): a backbone family's scale or soft cap read from its
config as data and applied by every head that offers them (`from_backbone` exact on Gemma 2/3, Granite,
Cohere with large logits, per component for the mixtures), a clear refusal where no head computes the
family's logits, and the soft cap and z-loss as training options: every CPU loss path equals the full
loss (values and gradients, fp32 1e-5), and the export writes them where a stock class holds them."""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F
from transformers import (BertConfig, BertLMHeadModel, CohereConfig, CohereForCausalLM, Gemma2Config,
                          Gemma2ForCausalLM, Gemma3ForCausalLM, Gemma3TextConfig, GPT2Config, GPT2LMHeadModel,
                          GraniteConfig, GraniteForCausalLM, LlamaConfig, LlamaForCausalLM)
from transformers.models.inkling.configuration_inkling import InklingTextConfig
from transformers.models.inkling.modeling_inkling import InklingForCausalLM

from hf_outheads import OutHeadsConfig, OutHeadsForCausalLM
from hf_outheads.backbones import LOGIT_TRANSFORMS, head_dims
from hf_outheads.head_linear import LinearHead

VOCAB = 128
SIZES = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
             num_key_value_heads=1, head_dim=16, max_position_embeddings=64, pad_token_id=0, bos_token_id=1,
             eos_token_id=2, initializer_range=1.0)  # large weights: logits far past the caps below
# the cases: each family's own head transform, set away from 1 / None
FAMILIES = {
    "gemma2": (Gemma2ForCausalLM, lambda: Gemma2Config(final_logit_softcapping=5.0, **SIZES), (1.0, 5.0)),
    "gemma3_text": (Gemma3ForCausalLM, lambda: Gemma3TextConfig(final_logit_softcapping=5.0, **SIZES), (1.0, 5.0)),
    "granite": (GraniteForCausalLM, lambda: GraniteConfig(logits_scaling=4.0, **SIZES), (0.25, 0.0)),
    "cohere": (CohereForCausalLM, lambda: CohereConfig(logit_scale=0.5, **SIZES), (0.5, 0.0)),
}
IDS = torch.randint(3, VOCAB, (2, 9), generator=torch.Generator().manual_seed(0))


def original(name: str):
    torch.manual_seed(0)
    model_class, config, _ = FAMILIES[name]
    return model_class(config()).eval()


def logits(model, ids=IDS):
    with torch.no_grad():
        return model(input_ids=ids).logits.float()


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_the_families_transforms_are_data_read_from_their_configs(name):
    model = original(name)
    dims = head_dims(model.config)
    assert (dims.logit_scale, dims.logit_softcap) == FAMILIES[name][2]
    assert name in LOGIT_TRANSFORMS


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_a_family_that_transforms_its_logits_converts_exactly(name):
    """Before the transforms were data, these converted silently with logits off by up to 31 (gemma2)."""
    model = original(name)
    want = logits(model)
    assert want.abs().max() > 4.0  # large logits: a missed transform shows
    converted = OutHeadsForCausalLM.from_backbone(model).eval()
    options = converted.config.resolved_head_options
    assert (options.logit_scale, options.logit_softcap) == FAMILIES[name][2]
    torch.testing.assert_close(logits(converted), want, rtol=1e-5, atol=1e-5)
    with torch.no_grad():
        torch.testing.assert_close(converted(input_ids=IDS, labels=IDS).loss, model(input_ids=IDS, labels=IDS).loss,
                                   rtol=1e-5, atol=1e-5)
        greedy = dict(max_new_tokens=5, do_sample=False, pad_token_id=0)
        assert torch.equal(converted.generate(IDS, **greedy), model.generate(IDS, **greedy))


@pytest.mark.parametrize("name", ["gemma2", "cohere"])
def test_a_mixture_applies_the_transform_per_component_and_converts_exactly(name, caplog):
    """Every MoS component starts as the original head, transformed before its own softmax: the
    mixture is exactly the original distribution."""
    model = original(name)
    with caplog.at_level(logging.WARNING, logger="hf_outheads"):
        converted = OutHeadsForCausalLM.from_backbone(model, head_type="mos", head_options={"num_components": 3}).eval()
    assert not caplog.records
    torch.testing.assert_close(logits(converted), logits(model).log_softmax(-1), rtol=1e-5, atol=1e-5)


def test_drill_under_a_soft_cap_says_its_start_is_not_exact(caplog):
    """relu branches start at a constant: every score of a position moves alike, the same softmax
    without a cap, another one under it. tanh branches start at zero: exact either way."""
    model = original("gemma2")
    with caplog.at_level(logging.WARNING, logger="hf_outheads"):
        relu = OutHeadsForCausalLM.from_backbone(model, head_type="drill").eval()
    assert "cannot reproduce" in caplog.text
    assert (logits(relu).log_softmax(-1) - logits(model).log_softmax(-1)).abs().max() > 1e-3
    tanh = OutHeadsForCausalLM.from_backbone(model, head_type="drill", head_options={"activation": "tanh"}).eval()
    torch.testing.assert_close(logits(tanh), logits(model), rtol=1e-5, atol=1e-5)


def test_a_head_without_the_transform_or_told_another_one_warns(caplog):
    model = original("gemma2")
    with caplog.at_level(logging.WARNING, logger="hf_outheads"):
        OutHeadsForCausalLM.from_backbone(model, head_type="sigsoftmax")
    assert "(1.0, 5.0)" in caplog.text and "logit_softcap" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="hf_outheads"):
        OutHeadsForCausalLM.from_backbone(model, head_options={"logit_softcap": 0})
    assert "logits differ from the original's" in caplog.text


def test_a_converted_model_passes_its_heads_transform_to_the_next_head():
    """An hf_outheads model whose head caps at 15 (not the family's 5), converted to `mos`: exact."""
    model = OutHeadsForCausalLM.from_backbone(original("gemma2"), head_options={"logit_softcap": 15.0}).eval()
    mos = OutHeadsForCausalLM.from_backbone(model, head_type="mos", head_options={"num_components": 2}).eval()
    assert mos.config.resolved_head_options.logit_softcap == 15.0
    torch.testing.assert_close(logits(mos), logits(model).log_softmax(-1), rtol=1e-5, atol=1e-5)


def test_a_family_whose_logits_no_head_computes_is_refused_by_name():
    config = InklingTextConfig(unpadded_vocab_size=100, **{k: v for k, v in SIZES.items() if k != "head_dim"})
    with pytest.raises(ValueError, match="'inkling_text' sets unpadded_vocab_size"):
        OutHeadsForCausalLM.from_backbone(InklingForCausalLM(config))
    bert = BertLMHeadModel(BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                      intermediate_size=64, is_decoder=True))
    with pytest.raises(ValueError, match=r"\('bert'\) cannot be converted: its LM head computes more than `W h \+ b`: "
                                         r"it has 4 parameters besides its output matrix and bias "
                                         r"\(cls.predictions.transform.dense.weight, ...\)"):
        OutHeadsForCausalLM.from_backbone(bert)


@pytest.mark.parametrize("family", ["cpmant", "moshi"])
def test_a_family_embedding_more_tokens_than_its_head_scores_is_refused_by_name(family):
    """CPM-Ant embeds its prompt tokens and Moshi its padding token past the `vocab_size` words their LM head
    scores: conversion and a model built on their config both refuse, naming the family and the counts."""
    from transformers import CpmAntConfig, CpmAntForCausalLM, MoshiConfig, MoshiForCausalLM

    if family == "cpmant":
        original = CpmAntForCausalLM(CpmAntConfig(vocab_size=64, hidden_size=32, num_hidden_layers=1,
                                                  num_attention_heads=2, dim_head=16, dim_ff=64, prompt_types=2,
                                                  prompt_length=4))
        rows, body = 72, "CpmAntModel"
    else:
        original = MoshiForCausalLM(MoshiConfig(vocab_size=64, hidden_size=32, num_hidden_layers=1,
                                                num_attention_heads=2, num_key_value_heads=2, head_dim=16, ffn_dim=64))
        rows, body = 65, "MoshiModel"
    refusal = (rf"The '{family}' backbone \({body}\) embeds {rows} tokens where its config's vocab_size, the words "
               r"the family's LM head scores, is 64: every hf_outheads head scores each row of the input embedding")
    with pytest.raises(ValueError, match=refusal):
        OutHeadsForCausalLM.from_backbone(original)
    with pytest.raises(ValueError, match=refusal):
        OutHeadsForCausalLM(OutHeadsConfig(text_config=original.config, head_type="linear"))


def tiny_gpt2_config():
    return GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=VOCAB, n_positions=64, bos_token_id=1, eos_token_id=2,
                      resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)


def test_the_options_default_to_the_backbones_transform_and_old_configs_keep_none():
    scratch = OutHeadsConfig(text_config=FAMILIES["gemma2"][1](), head_type="linear").resolved_head_options
    assert (scratch.logit_scale, scratch.logit_softcap, scratch.z_loss) == (1.0, 5.0, 0.0)
    plain = OutHeadsConfig(text_config=tiny_gpt2_config(), head_type="tied").resolved_head_options
    assert (plain.logit_scale, plain.logit_softcap) == (1.0, 0.0)
    given = OutHeadsConfig(text_config=FAMILIES["gemma2"][1](), head_type="mos", head_options={"logit_softcap": 0})
    assert given.resolved_head_options.logit_softcap == 0.0
    saved = OutHeadsConfig(text_config=FAMILIES["gemma2"][1](), head_type="linear").to_dict()
    for key in ("logit_scale", "logit_softcap", "z_loss"):
        del saved["head_options"][key]  # a config.json written before the options
    assert OutHeadsConfig.from_dict(saved).resolved_head_options.logit_softcap == 0.0


@pytest.mark.parametrize("options, message", [
    ({"z_loss": 1e-4, "training_loss": "sampled"}, "'z_loss' needs the full log-normaliser"),
    ({"logit_softcap": 15.0, "loss_kernel": "torch"}, "the loss kernel 'torch' takes no softcap"),
    ({"z_loss": 1e-4, "loss_kernel": "cce"}, "the loss kernel 'cce' takes no z_loss"),
    ({"logit_softcap": -1.0}, "'logit_softcap' must be a number >= 0"),
    ({"logit_scale": 0.0}, "'logit_scale' must be a number > 0"),
    ({"z_loss": -1.0}, "'z_loss' must be a number >= 0"),
])
def test_options_that_cannot_work_are_refused_by_name(options, message):
    with pytest.raises(ValueError, match=message):
        OutHeadsConfig(text_config=tiny_gpt2_config(), head_type="linear", head_options=options)


CAP, Z = 3.0, 1e-3


def gpt2_model(head_type="linear", **options):
    torch.manual_seed(0)
    config = OutHeadsConfig(text_config=tiny_gpt2_config(), head_type=head_type,
                            head_options={"logit_softcap": CAP, **options})
    model = OutHeadsForCausalLM(config).train()
    with torch.no_grad():  # scores far past the cap
        (model.head.weight if head_type != "tied" else model.get_input_embeddings().weight).mul_(30.0)
    return model


def loss_and_grads(model, labels=None):
    ids = IDS.clone()
    labels = ids.clone() if labels is None else labels
    model.zero_grad()
    out = model(input_ids=ids, labels=labels)
    out.loss.backward()
    return out, {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


def by_hand(model, labels):
    """NLL and z-loss of the soft-capped logits, written out: `c tanh(z / c)`, then `z_loss * mean(lse^2)`."""
    with torch.no_grad():
        hidden = model.backbone(input_ids=IDS).last_hidden_state
        scores = F.linear(hidden, model.head.weight, model.head.bias)
    capped = CAP * torch.tanh(scores / CAP)
    shifted = F.pad(labels, (0, 1), value=-100)[:, 1:]
    keep = shifted != -100
    nll = F.cross_entropy(capped.reshape(-1, VOCAB), shifted.reshape(-1), reduction="sum") / keep.sum()
    lse = capped.logsumexp(-1)
    return nll, Z * (lse.square() * keep).sum() / keep.sum()


@pytest.mark.parametrize("head_type", ["linear", "tied", "drill"])
@pytest.mark.parametrize("path", [{"training_loss": "chunked", "loss_kernel": "own"},
                                  {"training_loss": "chunked", "loss_kernel": "auto"}])
def test_softcap_and_z_loss_train_exactly_on_every_cpu_path(head_type, path):
    """The fused losses (the own kernel's CPU path; "auto" on a CPU: the own, since torch's takes no cap)
    equal the full logits' loss, NLL and z-loss, values and gradients, fp32 to 1e-5; ignored labels count nothing."""
    labels = IDS.clone()
    labels[0, 3:5] = -100
    extra = {"dropout": 0.0} if head_type == "drill" else {}
    full_out, full_grads = loss_and_grads(gpt2_model(head_type, z_loss=Z, training_loss="full", **extra), labels)
    out, got = loss_and_grads(gpt2_model(head_type, z_loss=Z, **path, **extra), labels)
    assert out.logits is None and full_out.logits.abs().max() <= CAP
    torch.testing.assert_close(out.nll_loss, full_out.nll_loss, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out.loss, full_out.loss, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out.aux_terms["z_loss"], full_out.aux_terms["z_loss"], rtol=1e-5, atol=1e-5)
    assert full_grads.keys() == got.keys()
    for name in got:
        torch.testing.assert_close(got[name], full_grads[name], rtol=1e-5, atol=1e-5, msg=name)
    if head_type == "linear":
        nll, z = by_hand(gpt2_model(head_type, z_loss=Z), labels)
        torch.testing.assert_close(full_out.nll_loss, nll, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(full_out.loss, nll + z, rtol=1e-5, atol=1e-5)


def test_the_z_loss_is_a_training_term_only():
    model = gpt2_model(z_loss=Z)
    trained = model(input_ids=IDS, labels=IDS)
    assert trained.loss > trained.nll_loss and set(trained.aux_terms) == {"z_loss"}
    evaluated = model.eval()(input_ids=IDS, labels=IDS)
    torch.testing.assert_close(evaluated.loss, evaluated.nll_loss)
    torch.testing.assert_close(evaluated.nll_loss, trained.nll_loss)


def test_the_sampled_loss_caps_the_candidates_scores():
    """With every word a candidate (fraction 1) the sampled softmax is the full one: equal, capped."""
    full = gpt2_model(training_loss="full")(input_ids=IDS, labels=IDS).loss
    sampled = gpt2_model(training_loss="sampled", sampled_fraction=1.0)(input_ids=IDS, labels=IDS).loss
    torch.testing.assert_close(sampled, full, rtol=1e-5, atol=1e-5)


def test_a_mixture_caps_each_component_in_its_fused_loss():
    def mos(training_loss):
        model = gpt2_model("mos", num_components=3, latent_init_noise=0.5)
        return model, model(input_ids=IDS, labels=IDS, return_logits=training_loss == "full")
    (full_model, full), (fused_model, fused) = mos("full"), mos("fused")
    assert fused.logits is None
    torch.testing.assert_close(fused.loss, full.loss, rtol=1e-5, atol=1e-5)
    full.loss.backward()
    fused.loss.backward()
    for (name, a), b in zip(full_model.head.named_parameters(), fused_model.head.parameters()):
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-5, atol=1e-5, msg=name)


def test_mtp_counts_its_shared_heads_z_loss():
    """The next-token z-loss goes into `loss` (and `aux_terms`), the future depths' too (weighted as their
    NLL); `nll_loss` and the future NLL stay what they were without it."""
    def mtp(z_loss):
        config = OutHeadsConfig(text_config=tiny_gpt2_config(), head_type="mtp", head_options={
            "head": "linear", "num_future": 1, "num_attention_heads": 2, "head_options": {"z_loss": z_loss}})
        torch.manual_seed(0)
        return OutHeadsForCausalLM(config).train()(input_ids=IDS, labels=IDS)
    plain, with_z = mtp(0.0), mtp(Z)
    assert "z_loss" not in plain.aux_terms and {"z_loss", "mtp_nll_1"} == set(with_z.aux_terms)
    torch.testing.assert_close(with_z.nll_loss, plain.nll_loss)
    torch.testing.assert_close(with_z.aux_terms["mtp_nll_1"], plain.aux_terms["mtp_nll_1"])
    assert with_z.loss - plain.loss > with_z.aux_terms["z_loss"] > 0  # the next token's, and the future's on top


@pytest.mark.parametrize("name", ["gemma2", "gemma3_text"])
def test_export_writes_the_cap_where_the_family_holds_one_and_refuses_elsewhere(name, tmp_path):
    from transformers import AutoModelForCausalLM

    gemma = OutHeadsForCausalLM.from_backbone(original(name), head_options={"logit_softcap": 15.0,
                                                                            "output_bias": False}).eval()
    gemma.export_plain(tmp_path / "gemma")
    plain = AutoModelForCausalLM.from_pretrained(tmp_path / "gemma").eval()
    assert plain.config.final_logit_softcapping == 15.0
    torch.testing.assert_close(logits(plain), logits(gemma), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="The 'gpt2' family's LM head applies no soft cap"):
        gpt2_model(output_bias=False).eval().export_plain(tmp_path / "gpt2")


def test_export_folds_a_scale_into_the_output_matrix(tmp_path):
    """A scale the family does not state (Llama) goes into the exported matrix; Cohere keeps its own field."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    llama = LlamaForCausalLM(LlamaConfig(**{k: v for k, v in SIZES.items() if k != "initializer_range"}))
    scaled = OutHeadsForCausalLM.from_backbone(llama, head_options={"logit_scale": 2.0}).eval()
    scaled.export_plain(tmp_path / "llama")
    torch.testing.assert_close(logits(AutoModelForCausalLM.from_pretrained(tmp_path / "llama")), logits(scaled),
                               rtol=1e-5, atol=1e-5)
    cohere = OutHeadsForCausalLM.from_backbone(original("cohere")).eval()
    cohere.export_plain(tmp_path / "cohere")
    plain = AutoModelForCausalLM.from_pretrained(tmp_path / "cohere").eval()
    assert plain.config.logit_scale == 0.5
    torch.testing.assert_close(logits(plain), logits(cohere), rtol=1e-5, atol=1e-5)


def test_a_linear_heads_word_scorer_is_its_forwards_logits():
    model = gpt2_model(logit_scale=0.5).eval()
    with torch.no_grad():
        hidden = model.backbone(input_ids=IDS).last_hidden_state
        scores = model.head.word_scorer(model.output_embedding_matrix())(hidden)
    torch.testing.assert_close(scores, logits(model), rtol=1e-6, atol=1e-6)
    assert isinstance(model.head, LinearHead)
