"""Single-softmax heads: loss without logits, sampled training, label matrices computed once."""

import pytest
import torch

from hf_outheads import HEAD_CLASSES, OutHeadsConfig, OutHeadsForCausalLM
from head_cases import HEAD_CASES
from hf_outheads.softmax import sample_candidates, sampled_nll_sum
from tiny import tiny_config

# the heads with the chunked and the sampled training loss (`training_losses()`), with their contract options
SINGLE = {head: HEAD_CASES[head] for head, cls in HEAD_CLASSES.items() if "sampled" in cls.training_losses()}


def model_for(head, **options):
    torch.manual_seed(0)
    config = OutHeadsConfig(text_config=tiny_config("llama"), head_type=head, head_options={**SINGLE[head], **options})
    return OutHeadsForCausalLM(config)


def batch():
    ids = torch.randint(3, 99, (2, 9), generator=torch.Generator().manual_seed(3))
    labels = ids.clone()
    labels[0, :4] = -100
    return ids, labels


def grads(model):
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("head", SINGLE)
def test_chunked_training_loss_equals_full_loss_without_logits(head):
    ids, labels = batch()
    full = model_for(head).train()
    out_full = full(input_ids=ids, labels=labels)
    out_full.loss.backward()
    lean = model_for(head, training_loss="chunked").train()
    out_lean = lean(input_ids=ids, labels=labels)
    out_lean.loss.backward()
    assert out_lean.logits is None and out_full.logits is not None
    torch.testing.assert_close(out_lean.loss, out_full.loss)
    g_full, g_lean = grads(full), grads(lean)
    assert g_full.keys() == g_lean.keys()
    for name in g_full:
        torch.testing.assert_close(g_lean[name], g_full[name], rtol=1e-4, atol=1e-6)


def test_return_logits_false_gives_exact_loss_in_eval_and_option_is_training_only():
    ids, labels = batch()
    model = model_for("drill", training_loss="chunked").eval()
    reference = model(input_ids=ids, labels=labels)
    assert reference.logits is not None  # evaluation always returns full logits
    lean = model(input_ids=ids, labels=labels, return_logits=False)
    assert lean.logits is None
    torch.testing.assert_close(lean.loss, reference.loss)


def test_sampled_candidates_hold_every_target_and_no_accidental_hit():
    targets = torch.tensor([5, 7, 7, 42, 5])
    for log_q in (None, torch.randn(100)):
        positives, negatives, log_incl = sample_candidates(targets, 100, 0.25, log_q)
        assert positives.tolist() == [5, 7, 42]
        assert not set(negatives.tolist()) & {5, 7, 42}
        assert len(set(negatives.tolist())) == negatives.numel() <= 22
        assert (log_incl <= 0).all()
    _, negatives, _ = sample_candidates(targets, 100, 0.25)
    assert negatives.numel() == 22  # uniform: exactly up to the fraction


def test_sampled_loss_with_the_whole_vocabulary_is_the_full_loss():
    torch.manual_seed(0)
    context, weight, bias = torch.randn(6, 8), torch.randn(50, 8), torch.randn(50)
    labels = torch.tensor([1, 4, -100, 4, 49, 0])
    full = torch.nn.functional.cross_entropy(context @ weight.T + bias, labels, reduction="sum")
    torch.testing.assert_close(sampled_nll_sum(context, weight, bias, labels, 1.0), full)
    partial = sampled_nll_sum(context, weight, bias, labels, 0.2)
    assert partial < full  # fewer competitors, smaller loss (before the correction it would be far smaller)


def test_sampled_training_learns_and_evaluation_uses_the_full_softmax():
    ids, labels = batch()
    model = model_for("tied", training_loss="sampled", sampled_fraction=0.3)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.eval()
    before = model(input_ids=ids, labels=labels).loss.item()
    model.train()
    for _ in range(15):
        out = model(input_ids=ids, labels=labels)
        assert out.logits is None
        out.loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    model.eval()
    evaluated = model(input_ids=ids, labels=labels)
    assert evaluated.logits is not None and evaluated.loss.item() < before - 0.3


def test_unigram_proposal_needs_word_counts():
    ids, labels = batch()
    model = model_for("linear", training_loss="sampled", sampled_proposal="unigram").train()
    with pytest.raises(ValueError, match="set_word_counts"):
        model(input_ids=ids, labels=labels)
    model.head.set_word_counts(torch.arange(99))
    model(input_ids=ids, labels=labels).loss.backward()
    assert model.head.weight.grad.abs().sum() > 0


def count_label_matrix_calls(head):
    calls = []
    original = head.label_matrix

    def counted(embeddings):
        calls.append(1)
        return original(embeddings)

    head.label_matrix = counted
    return calls


@pytest.mark.parametrize("head", ["drill", "joint"])
def test_generation_computes_the_label_matrix_once(head):
    model = model_for(head).eval()
    calls = count_label_matrix_calls(model.head)
    model.generate(torch.tensor([[5, 6, 7]]), max_new_tokens=6, min_new_tokens=6, do_sample=False)
    assert len(calls) == 1


def test_label_matrix_is_never_stale_and_kept_across_generate_calls():
    """Outside `generate` every forward recomputes the label matrix, so any weight change is
    seen, including `param.data` writes (which change no tensor version). `generate` keeps it
    across calls while its inputs hold the same values, and recomputes it after any change;
    training always recomputes it, with gradients."""
    ids, _ = batch()
    model = model_for("drill").eval()
    calls = count_label_matrix_calls(model.head)

    def logits():
        with torch.no_grad():
            return model(input_ids=ids).logits

    def first_scores():
        return model.generate(ids[:1], max_new_tokens=1, do_sample=False, output_scores=True,
                              return_dict_in_generate=True).scores[0]

    first = logits()
    assert torch.equal(logits(), first) and len(calls) == 2
    for param in (model.head.layers[0].weight, model.get_input_embeddings().weight):
        before = logits()
        param.data.mul_(1.5)  # no version bump: an old cache would return `before`
        assert not torch.equal(logits(), before)
    model.generate(ids[:1], max_new_tokens=3, min_new_tokens=3, do_sample=False)
    count = len(calls)
    kept = first_scores()
    assert len(calls) == count  # same values: the matrix of the previous call
    for param in (model.head.layers[0].weight, model.get_input_embeddings().weight):
        param.data.add_(0.5)  # same tensor, storage and version: only the values tell
        generated = first_scores()
        assert len(calls) == count + 1 and not torch.equal(generated, kept)
        with torch.no_grad():
            torch.testing.assert_close(generated, model(input_ids=ids[:1]).logits[:, -1])
        count, kept = len(calls), generated
    state = {k: v.clone() for k, v in model_for("drill").state_dict().items()}
    model.load_state_dict(state)
    fresh = model_for("drill").eval()
    with torch.no_grad():
        torch.testing.assert_close(logits(), fresh(input_ids=ids).logits)
    model.to(torch.float64)
    assert logits().dtype == torch.float64
    model.train()
    count = len(calls)
    model(input_ids=ids).logits.sum().backward()  # training: recomputed every forward, with gradients
    assert len(calls) == count + 1 and model.head.layers[0].weight.grad is not None
    tied = model_for("tied").eval()  # its label matrix is E itself: nothing kept, no copy of E
    tied.generate(ids[:1], max_new_tokens=2, do_sample=False)
    assert tied.head._label_cache is None
