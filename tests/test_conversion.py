"""`from_backbone`: a converted model computes exactly what the original transformers LM computes."""

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM, OPTConfig, OPTForCausalLM

from hf_outheads import HEAD_CLASSES, OutHeadsForCausalLM, OutHeadsForSeq2SeqLM
from tiny import ALL, SEQ2SEQ, batch, model_class, tiny_model, tiny_original

# the head whose form each tiny original has (tests/tiny.py ties GPT-2/T5/BART/Marian, unties the rest)
EXPECTED_HEAD = {"gpt2": "tied", "llama": "linear", "qwen2": "linear", "mistral": "linear",
                 "t5": "tied", "bart": "tied", "marian": "tied"}


def wrapper_class(name):
    return OutHeadsForSeq2SeqLM if name in SEQ2SEQ else OutHeadsForCausalLM


def assert_same_outputs(original, converted, inputs):
    with torch.no_grad():
        want, got = original(**inputs), converted(**inputs)
    torch.testing.assert_close(got.logits, want.logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got.loss, want.loss, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", sorted(ALL))
def test_converted_model_matches_original(name):
    original = tiny_original(name)
    converted = wrapper_class(name).from_backbone(original).eval()
    assert converted.config.head_type == EXPECTED_HEAD[name]
    assert converted.config.text_config.model_type == original.config.model_type
    assert_same_outputs(original, converted, batch(name))
    padded = batch(name)
    padded["labels"][0, -2:] = -100  # ignored positions (padding) are left out of the mean
    assert_same_outputs(original, converted, padded)


@pytest.mark.parametrize("name", ["gpt2", "llama", "t5", "marian"])
def test_from_backbone_local_path(name, tmp_path):
    original = tiny_original(name)
    original.save_pretrained(tmp_path)
    converted = wrapper_class(name).from_backbone(str(tmp_path)).eval()
    assert_same_outputs(original, converted, batch(name))


@pytest.mark.parametrize("name", ["llama", "bart"])
def test_converted_model_survives_save_and_auto_load(name, tmp_path):
    original = tiny_original(name)
    wrapper_class(name).from_backbone(original).save_pretrained(tmp_path)
    auto = AutoModelForSeq2SeqLM if name in SEQ2SEQ else AutoModelForCausalLM
    reloaded = auto.from_pretrained(tmp_path).eval()
    assert isinstance(reloaded, wrapper_class(name))
    assert_same_outputs(original, reloaded, batch(name))


def test_position_ids_reach_the_backbone():
    """GPT-2 has absolute positions: shifted position_ids change the logits, identically in both."""
    original = tiny_original("gpt2")
    converted = OutHeadsForCausalLM.from_backbone(original).eval()
    inputs = batch("gpt2")
    shifted = dict(inputs, position_ids=torch.arange(7).expand(2, 7) + 5)
    assert_same_outputs(original, converted, shifted)
    with torch.no_grad():
        assert not torch.allclose(converted(**inputs).logits, converted(**shifted).logits)


def test_bilinear_from_tied_original_is_exact():
    """`W_l = I` makes `E W_l h + b` the tied original exactly."""
    original = tiny_original("gpt2")
    converted = OutHeadsForCausalLM.from_backbone(original, head_type="bilinear").eval()
    assert converted.config.head_type == "bilinear"
    assert_same_outputs(original, converted, batch("gpt2"))


def test_tied_head_on_untied_original_warns(caplog):
    original = tiny_original("llama")
    with caplog.at_level("WARNING", logger="hf_outheads.tools.conversion"):
        converted = OutHeadsForCausalLM.from_backbone(original, head_type="tied").eval()
    assert "cannot reproduce the original LM head" in caplog.text
    with torch.no_grad():
        assert not torch.allclose(converted(**batch("llama")).logits, original(**batch("llama")).logits)


def test_opt_with_projected_embeddings():
    """OPT projects its output back to word_embed_proj_dim (d = d_h = 16 != hidden_size 32)."""
    torch.manual_seed(0)
    config = OPTConfig(hidden_size=32, word_embed_proj_dim=16, ffn_dim=64, num_hidden_layers=2,
                       num_attention_heads=4, vocab_size=99, max_position_embeddings=64)
    original = OPTForCausalLM(config).eval()
    converted = OutHeadsForCausalLM.from_backbone(original).eval()
    assert converted.config.head_type == "tied"
    assert (converted.head.dims.hidden_dim, converted.head.dims.embed_dim) == (16, 16)
    assert_same_outputs(original, converted, batch("gpt2"))


def test_from_backbone_forwards_loading_options(tmp_path):
    """`dtype` and `attn_implementation` go to the original's from_pretrained and carry over."""
    original = tiny_original("llama")
    original.save_pretrained(tmp_path)
    eager = OutHeadsForCausalLM.from_backbone(str(tmp_path), attn_implementation="eager")
    assert eager.backbone.config._attn_implementation == "eager"
    half = OutHeadsForCausalLM.from_backbone(str(tmp_path), dtype=torch.bfloat16).eval()
    assert {p.dtype for p in half.parameters()} == {torch.bfloat16}
    with torch.no_grad():
        torch.testing.assert_close(half(**batch("llama")).loss.float(), original(**batch("llama")).loss,
                                   rtol=0.02, atol=0.02)


def test_converted_model_keeps_the_originals_mode(tmp_path):
    original = tiny_original("gpt2")  # eval mode, as from_pretrained returns it
    assert not OutHeadsForCausalLM.from_backbone(original).training
    original.save_pretrained(tmp_path)
    assert not OutHeadsForCausalLM.from_backbone(str(tmp_path)).training
    assert OutHeadsForCausalLM.from_backbone(original.train()).training


@pytest.mark.parametrize("head_type", [None, "linear", "bilinear", "drill", "mos"])
@pytest.mark.parametrize("name", ["gpt2", "t5"])
def test_a_trained_model_with_a_plain_head_converts_to_another_head(name, head_type, tmp_path):
    """An hf_outheads model with the `tied` head (e.g. one trained with hf_outheads/training/train.py) is an
    ordinary LM: from_backbone swaps its head, exactly where the new head's form allows it."""
    plain = tiny_model(name, "tied")
    cls = type(plain)
    with torch.no_grad():
        plain.head.bias.normal_()
    plain.save_pretrained(tmp_path)
    converted = cls.from_backbone(str(tmp_path), head_type=head_type).eval()
    assert converted.config.head_type == (head_type or "tied")
    inputs = batch(name)
    with torch.no_grad():
        want, got = plain(**inputs).logits.log_softmax(-1), converted(**inputs).logits.float().log_softmax(-1)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_a_model_whose_head_is_not_a_plain_softmax_does_not_convert_but_keeps_its_head(tmp_path):
    """A trained `mos` model cannot become `drill`; asked for its own head (as train.py's
    `--pretrained <run> --head_type null` does to fine-tune it further, or `--head_type mos`, whose
    options object asks for nothing) it loads as it is."""
    model = tiny_model("gpt2", "mos").eval()
    with pytest.raises(ValueError, match="'mos' head is not a plain softmax.*'tied' or 'linear'"):
        OutHeadsForCausalLM.from_backbone(model, head_type="drill")
    model.save_pretrained(tmp_path)
    inputs = batch("gpt2")
    options = HEAD_CLASSES["mos"].Options
    for head_type, head_options in ((None, None), ("mos", None), ("mos", {}), (None, options())):
        kept = OutHeadsForCausalLM.from_backbone(str(tmp_path), head_type=head_type, head_options=head_options).eval()
        assert kept.config.head_type == "mos"
        with torch.no_grad():
            torch.testing.assert_close(kept(**inputs).logits, model(**inputs).logits, rtol=0, atol=0)
    for head_options in ({"num_components": 2}, options(num_components=2)):  # new options: a conversion, refused
        with pytest.raises(ValueError, match="not a plain softmax"):
            OutHeadsForCausalLM.from_backbone(str(tmp_path), head_options=head_options)


@pytest.mark.parametrize("head", sorted(HEAD_CLASSES))
def test_exact_conversion_capability_is_what_conversion_does(head):
    """A head class's `exact_conversion`: with its default options, converted from a tied LM head
    (GPT-2's), its next-token distributions are the original's; the others' are not."""
    original = tiny_original("gpt2")
    model = model_class("gpt2").from_backbone(original, head_type=head).eval()
    ids = torch.randint(3, 99, (2, 6), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        error = (original(input_ids=ids).logits.log_softmax(-1) - model(input_ids=ids).logits.log_softmax(-1)).abs().max()
    assert (error < 1e-5) == HEAD_CLASSES[head].exact_conversion, error
