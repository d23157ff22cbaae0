"""The memory-lean losses equal the naive computations: values and gradients, with ignored labels."""

import pytest
import torch
import torch.nn.functional as F

from hf_outheads import losses, mixture
from hf_outheads.losses import has_torch_linear_cross_entropy, linear_cross_entropy

IMPLS = ["own", "naive"] + (["torch"] if has_torch_linear_cross_entropy() else [])


def problem(n=37, d=6, vocab=23, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g, dtype=dtype).requires_grad_()
    weight = torch.randn(vocab, d, generator=g, dtype=dtype).requires_grad_()
    bias = torch.randn(vocab, generator=g, dtype=dtype).requires_grad_()
    target = torch.randint(0, vocab, (n,), generator=g)
    target[::4] = -100
    return x, weight, bias, target


def grads(value, tensors, seed=1):
    upstream = torch.randn(value.shape, generator=torch.Generator().manual_seed(seed))
    return torch.autograd.grad((value * upstream).sum(), tensors, retain_graph=True)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("chunk_rows", [5, None])
def test_linear_cross_entropy_equals_naive(impl, chunk_rows):
    x, weight, bias, target = problem()
    want = F.cross_entropy(F.linear(x, weight, bias), target, reduction="none")  # ignore_index -100: 0
    got = linear_cross_entropy(x, weight, target, bias, chunk_rows=chunk_rows, impl=impl)
    assert got.dtype == torch.float32 and got.shape == target.shape
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert torch.all(got[target == -100] == 0)
    for g_got, g_want in zip(grads(got, (x, weight, bias)), grads(want, (x, weight, bias))):
        torch.testing.assert_close(g_got, g_want, rtol=1e-5, atol=1e-5)
    assert torch.all(grads(got, (x,))[0][target == -100] == 0)  # ignored rows get no gradient


def test_linear_cross_entropy_keeps_target_shape_and_handles_edge_cases():
    x, weight, bias, target = problem(n=12)
    got = linear_cross_entropy(x.reshape(3, 4, -1), weight, target.reshape(3, 4), bias)
    assert got.shape == (3, 4)
    torch.testing.assert_close(got.reshape(-1), linear_cross_entropy(x, weight, target, bias, impl="naive"))
    empty = linear_cross_entropy(x[:0], weight, target[:0], bias)
    assert empty.shape == (0,) and empty.sum().item() == 0
    empty.sum().backward()  # still part of the graph
    low = linear_cross_entropy(x.bfloat16(), weight.bfloat16(), target, None)
    assert low.dtype == torch.float32
    with pytest.raises(ValueError, match="impl"):
        linear_cross_entropy(x, weight, target, impl="fast")


def test_fallback_when_torch_lacks_linear_cross_entropy(monkeypatch):
    x, weight, bias, target = problem()
    want = linear_cross_entropy(x, weight, target, bias, impl="naive")
    monkeypatch.setattr(losses, "has_torch_linear_cross_entropy", lambda: False)
    torch.testing.assert_close(linear_cross_entropy(x, weight, target, bias, chunk_rows=8), want)


def naive_mixture_log_probs(log_prior, latents, weight, bias):
    """The reference's N x J x |V| computation, in log space."""
    return torch.logsumexp(log_prior.unsqueeze(-1) + F.linear(latents, weight, bias).log_softmax(-1), dim=-2)


def mixture_problem(seed=0):
    g = torch.Generator().manual_seed(seed)
    prior_logits = torch.randn(2, 9, 4, generator=g).requires_grad_()
    latents = torch.randn(2, 9, 4, 6, generator=g).requires_grad_()
    weight = torch.randn(23, 6, generator=g).requires_grad_()
    bias = torch.randn(23, generator=g).requires_grad_()
    labels = torch.randint(0, 23, (2, 9), generator=g)
    labels[0, :3] = -100
    labels[1, -1] = -100
    return prior_logits, latents, weight, bias, labels


def test_exact_mixture_loss_equals_naive_values_and_gradients():
    prior_logits, latents, weight, bias, labels = mixture_problem()
    params = (prior_logits, latents, weight, bias)
    naive = naive_mixture_log_probs(prior_logits.log_softmax(-1), latents, weight, bias)
    want = F.cross_entropy(naive.reshape(-1, 23), labels.reshape(-1), reduction="sum")
    got = losses.mixture_nll_sum(prior_logits.log_softmax(-1), latents, weight, bias, labels)
    assert got.shape == ()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    for g_got, g_want in zip(torch.autograd.grad(got, params), torch.autograd.grad(want, params)):
        torch.testing.assert_close(g_got, g_want, rtol=1e-5, atol=1e-5)


def test_mixture_log_probs_chunked_equals_naive(monkeypatch):
    prior_logits, latents, weight, bias, _ = mixture_problem()
    params = (prior_logits, latents, weight, bias)
    want = naive_mixture_log_probs(prior_logits.log_softmax(-1), latents, weight, bias)
    monkeypatch.setattr(losses, "LOG_PROBS_CHUNK_ELEMENTS", 5 * 4 * 23)  # 5 rows per chunk, checkpointed
    got = mixture.mixture_log_probs(prior_logits.log_softmax(-1), latents, weight, bias)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(got.logsumexp(-1), torch.zeros(2, 9), atol=1e-5, rtol=0)
    for g_got, g_want in zip(grads(got, params), grads(want, params)):
        torch.testing.assert_close(g_got, g_want, rtol=1e-5, atol=1e-5)
