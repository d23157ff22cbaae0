"""`sigsoftmax` (Kanai et al. 2018): the distribution, its rank beyond the softmax bottleneck,
the chunked exact loss, and what it refuses."""

from __future__ import annotations

import pytest
import torch

from hf_outheads import HeadDims, OutHeadsConfig, OutHeadsForCausalLM
from hf_outheads.head_interface import HeadInputs
from hf_outheads.head_linear import LinearHead, LinearOptions
from hf_outheads.head_sigsoftmax import SigSoftmaxHead, SigSoftmaxOptions
from tiny import tiny_config, tiny_model, tiny_original


def head(kind=SigSoftmaxHead, options=SigSoftmaxOptions, d=4, vocab=50, **values):
    torch.manual_seed(0)
    dims = HeadDims(vocab_size=vocab, embed_dim=d, hidden_dim=d, num_layers=2)
    h = kind(options(**values).resolve(dims), dims)
    h.reset_parameters()
    with torch.no_grad():
        h.weight.normal_(0, 1.0)
        h.bias.normal_(0, 1.0)
    return h


def test_probabilities_are_sigsoftmax_of_the_linear_scores():
    sig = head()
    hidden = torch.randn(3, 4)
    z = (hidden.double() @ sig.weight.double().T + sig.bias.double())
    expected = torch.exp(z) * torch.sigmoid(z)
    expected = expected / expected.sum(-1, keepdim=True)
    logits = sig(HeadInputs(hidden=hidden, embeddings=torch.zeros(50, 4))).logits
    torch.testing.assert_close(logits.softmax(-1).double(), expected, rtol=1e-5, atol=1e-7)


def centred_rank(log_probs: torch.Tensor) -> int:
    return int(torch.linalg.matrix_rank((log_probs - log_probs.mean(-1, keepdim=True)).double(), rtol=1e-4))  # fp32 scores


def test_log_probabilities_escape_the_softmax_bottleneck():
    """Over many contexts a softmax's centred log-probabilities have rank <= d + 1 (an affine map
    of h; Yang et al. 2018);
    sigsoftmax's are not bounded by d (Kanai et al. 2018, Theorem 4)."""
    hidden = torch.randn(200, 4) * 3
    E = torch.zeros(50, 4)
    with torch.no_grad():
        linear = head(LinearHead, LinearOptions)(HeadInputs(hidden=hidden, embeddings=E)).logits.log_softmax(-1)
        sig = head()(HeadInputs(hidden=hidden, embeddings=E)).logits.log_softmax(-1)
    assert centred_rank(linear) <= 5
    assert centred_rank(sig) > 10


def test_chunked_loss_equals_the_full_loss_and_its_gradients(monkeypatch):
    from hf_outheads import losses

    monkeypatch.setattr(losses, "fused_chunk_rows", lambda *args: 7)  # 3 x 10 rows: 5 chunks
    hidden, labels = torch.randn(3, 10, 4), torch.randint(0, 50, (3, 10))
    labels[0, :3] = -100
    results = []
    for loss in ("full", "chunked"):
        h = head(training_loss=loss).train()
        x = hidden.clone().requires_grad_()
        out = h(HeadInputs(hidden=x, embeddings=torch.zeros(50, 4)), labels)
        assert (out.logits is None) == (loss == "chunked")
        out.nll_sum.backward()
        results.append((out.nll_sum.detach(), x.grad, h.weight.grad, h.bias.grad))
    for full, chunked in zip(*results):
        torch.testing.assert_close(chunked, full, rtol=1e-5, atol=1e-6)


def test_sampled_loss_and_plain_export_are_refused():
    with pytest.raises(ValueError, match="sigsoftmax.*'training_loss'='sampled' is not one of"):
        OutHeadsConfig(text_config=tiny_config("gpt2"), head_type="sigsoftmax", head_options={"training_loss": "sampled"})
    with pytest.raises(ValueError, match=r"'sigsoftmax' has no plain equivalent: `softmax\(z \+ log sigmoid\(z\)\)` is not a "
                       "softmax of an affine map"):
        tiny_model("gpt2", "sigsoftmax").export_plain("unused")


def test_conversion_copies_the_head_and_says_it_is_approximate():
    original = tiny_original("llama")
    model = OutHeadsForCausalLM.from_backbone(original, head_type="sigsoftmax")
    torch.testing.assert_close(model.head.weight, original.lm_head.weight)
    assert model.head.init_from_lm_head(original.lm_head.weight, torch.zeros(99), None) is False


def test_chunked_loss_computes_its_gradient_in_one_pass(monkeypatch):
    """The `log sigma` is fused into the chunked loss: forward scores each chunk once (its scores,
    dx, dW products), backward only scales the gradients it kept (no scores recomputed)."""
    from hf_outheads import losses
    from test_fused_losses import PRODUCTS, Recorder

    monkeypatch.setattr(losses, "fused_chunk_rows", lambda *args: 8)  # 30 rows: 4 chunks
    h = head(training_loss="chunked").train()
    x = torch.randn(3, 10, 4, requires_grad=True)
    with Recorder() as forward:
        nll = h(HeadInputs(hidden=x, embeddings=torch.zeros(50, 4)), torch.randint(0, 50, (3, 10))).nll_sum
    assert sum(op in PRODUCTS for op in forward.ops) == 4 * 4  # scores, dx, dW, db per chunk
    with Recorder() as backward:
        nll.backward()
    assert backward.ops and not PRODUCTS & set(backward.ops) and "log_sigmoid_forward" not in backward.ops


def test_chunked_loss_in_bf16_is_the_full_loss_to_bf16_rounding():
    hidden, labels = torch.randn(2, 9, 4), torch.randint(0, 50, (2, 9))
    full = head().train()
    want = full(HeadInputs(hidden=hidden, embeddings=torch.zeros(50, 4)), labels).nll_sum
    lean = head(training_loss="chunked").train().to(torch.bfloat16)
    got = lean(HeadInputs(hidden=hidden.bfloat16(), embeddings=torch.zeros(50, 4)), labels).nll_sum
    assert got.dtype == torch.float32 and torch.isfinite(got)
    torch.testing.assert_close(got, want, rtol=2e-2, atol=0)


def test_configs_saved_with_the_linear_options_still_load():
    """Before sigsoftmax composed `linear`'s parts it inherited its options: saved configs state the
    sampled loss's options, which are dropped on load; given anew they are an error."""
    saved = OutHeadsConfig(text_config=tiny_config("gpt2"), head_type="sigsoftmax").to_dict()
    saved["head_options"].update(sampled_fraction=0.25, sampled_proposal="uniform")
    assert OutHeadsConfig.from_dict(saved).head_options == {"training_loss": "auto", "output_bias": True}
    with pytest.raises(ValueError, match="Unknown option.*sampled_fraction"):
        OutHeadsConfig(text_config=tiny_config("gpt2"), head_type="sigsoftmax", head_options={"sampled_fraction": 0.5})
