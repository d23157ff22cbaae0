"""Analytic training FLOPs (`hf_outheads.training.flops`, `head.forward_flops`) against torch's own
FLOP counter, and perplexity by training-frequency band (`hf_outheads.training.frequency_bands`)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from hf_outheads.training.flops import training_flops_per_step
from hf_outheads.training.frequency_bands import FrequencyBands, frequency_band_perplexity
from hf_outheads.head_interface import HeadInputs
from head_cases import HEAD_CASES
from tiny import VOCAB, tiny_model


def counted(fn) -> int:
    with FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()


@pytest.mark.parametrize("head_type", [h for h in HEAD_CASES if h not in ("lightrnn", "mtp")])
def test_head_forward_flops_match_torch_counter(head_type):
    """Full-softmax forward (no labels) of every head but lightrnn and mtp, whose formulas count their
    training forwards: lightrnn's loss path (first codes and the label's row only), not the full table
    of a scoring forward; mtp's future predictors, which only a forward with labels runs
    (tests/test_head_mtp.py counts that one)."""
    model = tiny_model("gpt2", head_type, HEAD_CASES[head_type])
    head, n = model.head, 2 * 10
    torch.manual_seed(0)
    inputs = HeadInputs(hidden=torch.randn(2, 10, 32), embeddings=model.backbone.get_input_embeddings().weight,
                        layers={i: torch.randn(2, 10, 32) for i in head.layer_indices})
    assert counted(lambda: head(inputs)) == head.forward_flops(n)
    assert head.forward_flops(2 * n) > head.forward_flops(n) > 0


def test_label_encoder_is_counted_once_per_forward():
    drill = tiny_model("gpt2", "drill", {"depth": 2}).head
    tied = tiny_model("gpt2", "tied").head
    extra = drill.forward_flops(1000) - tied.forward_flops(1000)
    assert extra == drill.forward_flops(1) - tied.forward_flops(1) == 2 * 2 * VOCAB * 32 * 32


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_training_flops_are_three_forwards_of_backbone_and_head(family):
    model = tiny_model(family, "linear")
    model.backbone.set_attn_implementation("eager")  # torch's counter does not see CPU sdpa's products
    ids = torch.randint(3, VOCAB, (3, 16))
    forward = counted(lambda: model.backbone(input_ids=ids)) + model.head.forward_flops(3 * 16)
    assert training_flops_per_step(model, 3 * 16, 16) == 3 * forward


def test_seq2seq_flops_grow_with_source_and_target():
    model = tiny_model("bart", "tied")
    base = training_flops_per_step(model, 40, 10, 40, 10)
    assert training_flops_per_step(model, 40, 10, 80, 20) > base
    assert training_flops_per_step(model, 80, 10, 40, 10) > base


def test_bands_partition_tokens_and_reproduce_the_overall_perplexity():
    counts = torch.tensor([0, 5, 99, 100, 500, 999, 1000, 10**6])
    bands = FrequencyBands(counts)
    assert bands.band_of.tolist() == [0, 0, 0, 1, 1, 1, 2, 2]
    assert bands.words.tolist() == [3, 3, 2]
    torch.manual_seed(0)
    labels = torch.tensor([[0, 1, 3, 6, -100], [7, 7, 4, -100, 2]])
    nll = torch.rand(2, 5) * 3
    bands.update(nll, labels)
    out = bands.results()
    keep = labels != -100
    assert sum(b["tokens"] for b in out.values()) == int(keep.sum())
    rare = nll[(labels >= 0) & (labels <= 2)]
    assert out["rare"]["perplexity"] == pytest.approx(math.exp(rare.double().mean().item()))
    overall = sum(b["tokens"] * math.log(b["perplexity"]) for b in out.values()) / int(keep.sum())
    assert overall == pytest.approx(nll[keep].double().mean().item())
    assert out["frequent"]["train_count_range"] == [1000, None]


def test_band_without_tokens_has_no_perplexity():
    bands = FrequencyBands(torch.tensor([1, 2000]))
    bands.update(torch.tensor([[1.0]]), torch.tensor([[1]]))
    assert bands.results()["rare"] == {"perplexity": None, "tokens": 0, "words": 1, "train_count_range": [0, 100]}


@pytest.mark.parametrize("bad, message", [
    (dict(word_counts=[1, -1]), "non-negative"),
    (dict(word_counts=[1, 2], edges=(10, 5)), "strictly increasing"),
    (dict(word_counts=[1, 2], edges=(10,)), "one name more"),
])
def test_band_errors(bad, message):
    with pytest.raises(ValueError, match=message):
        FrequencyBands(**bad)


def test_label_outside_the_counted_vocabulary_is_an_error():
    with pytest.raises(ValueError, match="outside the 2-word vocabulary"):
        FrequencyBands([1, 2]).update(torch.zeros(1, 1), torch.tensor([[5]]))


@pytest.mark.parametrize("family, head_type", [("gpt2", "drill"), ("llama", "mos"), ("bart", "tied")])
def test_model_band_perplexities_combine_to_its_perplexity(family, head_type):
    model = tiny_model(family, head_type, HEAD_CASES[head_type])
    counts = torch.arange(VOCAB) * 25  # every band has words
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(3, VOCAB, (4, 12), generator=g)
    if model.config.is_encoder_decoder:
        batch = {"input_ids": ids, "labels": torch.randint(3, VOCAB, (4, 9), generator=g)}
        logits = model(input_ids=ids, labels=batch["labels"]).logits
        loss = F.cross_entropy(logits.float().flatten(0, 1), batch["labels"].flatten())
        tokens = batch["labels"].numel()
    else:
        batch = {"input_ids": ids, "labels": ids}
        logits = model(input_ids=ids).logits[:, :-1]
        loss = F.cross_entropy(logits.float().flatten(0, 1), ids[:, 1:].flatten())
        tokens = ids[:, 1:].numel()
    out = frequency_band_perplexity(model, [batch], counts)
    assert sum(b["tokens"] for b in out.values()) == tokens
    combined = sum(b["tokens"] * math.log(b["perplexity"]) for b in out.values() if b["tokens"]) / tokens
    assert combined == pytest.approx(loss.item(), rel=1e-5)
    assert not model.training
