"""The model classes at the edges of their inputs: all-ignored batches, out-of-range labels and
token ids (checked on the host and by `generate`, not in `forward`), empty kept positions, word counts, loaded code tables, incomplete configs, generation
length."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import GPT2Config

from hf_outheads import OutHeadsConfig, OutHeadsForCausalLM
from hf_outheads.head_catalog import get_head_class
from hf_outheads.model_io import check_labels, check_token_ids
from head_cases import HEAD_CASES
from tiny import VOCAB, tiny_config, tiny_model, tiny_original


def training_losses(head: str) -> tuple:
    """The `training_loss` values a head offers (`training_losses()`); (None,) for heads without the option."""
    losses = get_head_class(head).training_losses()
    return (None,) if losses == ("exact",) else losses


LOSS_CASES = [(head, loss) for head in sorted(HEAD_CASES) for loss in training_losses(head)]


def ids(length=7):
    return torch.randint(3, VOCAB, (2, length), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("head,loss", LOSS_CASES, ids=[f"{h}-{l}" for h, l in LOSS_CASES])
def test_all_ignored_batch_gives_zero_loss_zero_gradients_and_no_nan_after_adamw(head, loss):
    model = tiny_model("llama", head, {**HEAD_CASES[head], **({"training_loss": loss} if loss else {})}).train()
    inputs = ids()
    out = model(input_ids=inputs, labels=torch.full_like(inputs, -100))
    assert out.loss.item() == 0.0
    out.loss.backward()
    for name, param in model.named_parameters():
        assert param.grad is None or (torch.isfinite(param.grad).all() and not param.grad.any()), name
    torch.optim.AdamW(model.parameters(), lr=1e-2).step()
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert torch.isfinite(model.eval()(input_ids=inputs).logits).all()


def test_all_ignored_batch_with_num_items_in_batch_zero_is_zero():
    model = tiny_model("llama", "doc", HEAD_CASES["doc"]).train()
    inputs = ids()
    loss = model(input_ids=inputs, labels=torch.full_like(inputs, -100), num_items_in_batch=torch.tensor(0)).loss
    assert loss.item() == 0.0


@pytest.mark.parametrize("bad", [-1, VOCAB])
def test_out_of_range_labels_are_named_by_the_host_side_check(bad):
    """Labels are checked on the host, where a batch is built (`model_io.check_labels`, whatever the head),
    not in the model's `forward`, which reads nothing back from the device (the training
    collator's check that names the example is the training loop's)."""
    labels = ids().clone()
    labels[1, 3] = bad
    with pytest.raises(ValueError, match=rf"labels must be -100 .* \[0, {VOCAB}\); got \[{bad}\]"):
        check_labels(labels, VOCAB)
    labels[1, 3] = -100
    labels[0, 0] = VOCAB - 1
    check_labels(labels, VOCAB)  # -100 and the last id are fine


@pytest.mark.parametrize("head", sorted(HEAD_CASES))
def test_no_kept_position_gives_empty_logits(head):
    model = tiny_model("llama", head, HEAD_CASES[head])
    with torch.no_grad():
        logits = model(input_ids=ids(), logits_to_keep=torch.tensor([], dtype=torch.long)).logits
    assert logits.shape == (2, 0, VOCAB)


def test_unigram_word_counts_of_the_wrong_length_are_rejected_when_set():
    model = tiny_model("llama", "linear", {"training_loss": "sampled", "sampled_proposal": "unigram"})
    for counts in (torch.ones(VOCAB - 1), torch.ones(VOCAB + 5)):
        with pytest.raises(ValueError, match=rf"set_word_counts needs one finite count per word of the {VOCAB}-word"):
            model.head.set_word_counts(counts)
    with pytest.raises(ValueError, match="negative count"):
        model.head.set_word_counts(-torch.ones(VOCAB))
    model.head.set_word_counts(torch.arange(VOCAB))


def test_lightrnn_rejects_a_loaded_code_table_that_is_not_injective_or_out_of_range(tmp_path):
    model = tiny_model("llama", "lightrnn", HEAD_CASES["lightrnn"])
    model.save_pretrained(tmp_path)
    for bad in ("shared", "range"):
        codes = model.head.codes.clone()
        if bad == "shared":
            codes[5] = codes[6]
        else:
            codes[5] = 8 + 8 * 16
        with pytest.raises(ValueError, match="not injective" if bad == "shared" else "out of range"):
            tiny_model("llama", "lightrnn", HEAD_CASES["lightrnn"]).load_state_dict({**model.state_dict(), "head.codes": codes})
        weights = load_file(tmp_path / "model.safetensors")
        save_file({**weights, "head.codes": codes}, tmp_path / "model.safetensors", metadata={"format": "pt"})
        with pytest.raises(ValueError, match="Head 'lightrnn': the loaded 'head.codes'"):
            OutHeadsForCausalLM.from_pretrained(tmp_path)
    tiny_model("llama", "lightrnn", HEAD_CASES["lightrnn"]).load_state_dict(model.state_dict())  # a valid table loads


def test_config_without_backbone_or_head_type_says_to_use_from_backbone(tmp_path):
    OutHeadsConfig()  # transformers builds one without arguments (diffs, repr)
    repr(OutHeadsConfig())
    with pytest.raises(ValueError, match="no text_config .*from_backbone"):
        OutHeadsForCausalLM(OutHeadsConfig(head_type="linear"))
    tiny_model("llama", "linear").save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    for key in ("head_type", "text_config"):
        (tmp_path / "config.json").write_text(json.dumps({k: v for k, v in saved.items() if k != key}))
        with pytest.raises(ValueError, match=f"has no {key}.*from_backbone"):
            OutHeadsForCausalLM.from_pretrained(tmp_path)
    GPT2Config(n_embd=32, n_layer=1, n_head=2).save_pretrained(tmp_path)  # a plain GPT-2 folder
    with pytest.raises(ValueError, match="`gpt2` config has no text_config and no head_type.*from_backbone"):
        OutHeadsConfig.from_pretrained(tmp_path)


@pytest.mark.parametrize("scale", [0, -1.0, float("nan"), float("inf"), "abc", True])
def test_hidden_scale_must_be_a_positive_finite_number(scale):
    with pytest.raises(ValueError, match="hidden_scale must be a positive finite number"):
        OutHeadsConfig(text_config=tiny_config("llama"), hidden_scale=scale)


def test_composite_config_answers_backbone_attributes_but_not_generation_parameters():
    config = OutHeadsConfig(text_config=tiny_config("t5"), head_type="tied")
    assert config.d_model == 32 and config.num_heads == 4
    gpt2 = OutHeadsConfig(text_config=tiny_config("gpt2"), head_type="tied")
    assert gpt2.max_position_embeddings == 64 and not hasattr(gpt2, "num_beams") and not hasattr(gpt2, "_nothing")
    assert config._get_generation_parameters() == {}


@pytest.mark.filterwarnings("ignore:Using the model-agnostic default `max_length`:UserWarning")  # the case under test
def test_default_length_generation_stops_where_the_backbone_positions_end():
    original = tiny_original("gpt2")
    model = OutHeadsForCausalLM.from_backbone(original).eval()
    prompt = torch.full((1, 60), 5)  # 60 + 20 default new tokens > n_positions = 64
    expected = original.generate(prompt, do_sample=False)
    assert expected.shape[1] == 64
    assert torch.equal(model.generate(prompt, do_sample=False), expected)


@pytest.mark.parametrize("family", ["gpt2", "t5"])
def test_a_token_id_beyond_the_vocabulary_names_the_id_and_the_size(family):
    """`generate` checks its prompt once per call (a seq2seq encoder runs outside `forward`); `forward`
    checks nothing (no read back from the device; a training batch is checked where it is built)."""
    from tiny import VOCAB, tiny_model

    model = tiny_model(family, "tied").eval()
    message = f"token id {VOCAB + 7}, outside the model's vocabulary of {VOCAB} ids.*resize_token_embeddings"
    with pytest.raises(ValueError, match=message):
        model.generate(torch.tensor([[3, 4, VOCAB + 7]]), max_new_tokens=2)
    with pytest.raises(ValueError, match="token id -1"):
        model.generate(torch.tensor([[3, -1]]), max_new_tokens=2)
    with pytest.raises(ValueError, match="token id -1"):
        check_token_ids(torch.tensor([[3, -1]]), VOCAB)  # the same check, where a batch is built
    assert model.generate(torch.tensor([[3, VOCAB - 1]]), max_new_tokens=2).shape[1] >= 2  # the last id is fine
