"""`labels="own"` for the heads that encode a label matrix (bilinear, joint, drill): the encoder
reads an own `|V| x d` matrix instead of the input embeddings E."""

from __future__ import annotations

import pytest
import torch

from hf_outheads import OutHeadsForCausalLM
from hf_outheads.head_interface import HeadInputs
from tiny import VOCAB, batch, tiny_model, tiny_original

ENCODERS = ["bilinear", "joint", "drill"]


@pytest.mark.parametrize("head_type", ENCODERS)
def test_own_labels_replace_the_embeddings_in_the_encoder(head_type):
    head = tiny_model("gpt2", head_type, {"labels": "own"}).head
    assert head.own_labels.shape == (VOCAB, 32)
    torch.manual_seed(0)
    hidden, E = torch.randn(2, 5, 32), torch.randn(VOCAB, 32)
    with torch.no_grad():
        first = head(HeadInputs(hidden=hidden, embeddings=E)).logits
        assert torch.equal(first, head(HeadInputs(hidden=hidden, embeddings=E * 3)).logits)  # E is not read
        head.own_labels.mul_(3)
        assert not torch.allclose(first, head(HeadInputs(hidden=hidden, embeddings=E)).logits)


@pytest.mark.parametrize("head_type", ENCODERS)
def test_from_scratch_the_other_parameters_draw_the_same_values(head_type):
    """Paired comparisons: own labels are drawn last, so every other parameter matches E-encoding's."""
    plain = dict(tiny_model("gpt2", head_type, seed=3).named_parameters())
    own = dict(tiny_model("gpt2", head_type, {"labels": "own"}, seed=3).named_parameters())
    assert set(own) - set(plain) == {"head.own_labels"}
    assert all(torch.equal(plain[name], own[name]) for name in plain)


@pytest.mark.parametrize("head_type", ENCODERS)
@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_conversion_with_own_labels_is_exact_from_tied_and_untied_heads(head_type, family):
    """Own labels start as the original head's matrix, so an untied original (Llama) converts
    exactly too; with E (the default) it is a least-squares fit."""
    original = tiny_original(family)
    model = OutHeadsForCausalLM.from_backbone(original, head_type=head_type, head_options={"labels": "own"}).eval()
    ids = batch(family)["input_ids"]
    with torch.no_grad():
        diff = model(input_ids=ids).logits - original(input_ids=ids).logits
    diff = diff - diff.mean(-1, keepdim=True)  # drill's relu conversion moves every logit of a position equally
    assert diff.abs().max() < 1e-5


@pytest.mark.parametrize("head_type", ENCODERS)
def test_own_labels_train_and_save(head_type, tmp_path):
    model = tiny_model("gpt2", head_type, {"labels": "own"}).train()
    ids = batch("gpt2")["input_ids"]
    model(input_ids=ids, labels=ids).loss.backward()
    assert model.head.own_labels.grad.abs().sum() > 0
    model.eval().save_pretrained(tmp_path)
    loaded = OutHeadsForCausalLM.from_pretrained(tmp_path)
    assert loaded.config.head_options["labels"] == "own"
    with torch.no_grad():
        assert torch.equal(loaded(input_ids=ids).logits, model(input_ids=ids).logits)


@pytest.mark.parametrize("head_type", ENCODERS)
def test_the_plain_equivalent_folds_the_own_labels(head_type):
    """`equivalent_lm_head` (the plain export) encodes the own labels, not E."""
    head = tiny_model("gpt2", head_type, {"labels": "own"}).head
    with torch.no_grad():
        head.own_labels.normal_(0, 0.5)
        torch.manual_seed(1)
        hidden, E = torch.randn(2, 5, 32), torch.randn(VOCAB, 32)
        weight, bias = head.equivalent_lm_head(E)
        assert torch.allclose(hidden @ weight.T + bias, head(HeadInputs(hidden=hidden, embeddings=E)).logits, atol=1e-5)


@pytest.mark.parametrize("head_type", ENCODERS)
def test_only_heads_that_read_e_present_it_as_their_weight(head_type):
    """`TiedToEmbeddings`: accelerate's FSDP2 plan groups E with the head when `head.weight is E`;
    own labels read no E, so the head has no such `weight`."""
    model = tiny_model("gpt2", head_type)
    assert model.head.weight is model.get_input_embeddings().weight
    assert not hasattr(tiny_model("gpt2", head_type, {"labels": "own"}).head, "weight")
