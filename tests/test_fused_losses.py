"""The fused exact losses (`losses.mixture_nll_sum`, `linear_cross_entropy(reduction="sum")`)
equal the naive `-log sum_j pi_j softmax_j(y)` loss, values and gradients, in fp32, bf16 and
fp16, with ignored labels and all-ignored batches; backward recomputes nothing; the heads'
lean losses have the gradients of their full log-probabilities; mixture generation's one-call
log-probabilities equal the chunked ones."""

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from hf_outheads import losses, mixture
from hf_outheads.head_interface import HeadInputs
from test_head_lightrnn import head as lightrnn_head
from test_head_lightrnn import inputs as lightrnn_inputs
from test_losses import IMPLS, problem
from tiny import batch, tiny_model

PRODUCTS = {"mm", "addmm", "addmm_", "addmv", "addmv_", "mv", "bmm", "baddbmm", "matmul", "linear"}


def mixture_problem(n=29, K=4, d=6, vocab=23, dtype=torch.float32, bias=True, seed=0):
    """(prior logits, latents, W, b or None), labels with every third one ignored."""
    g = torch.Generator().manual_seed(seed)
    make = lambda *shape: torch.randn(*shape, generator=g).to(dtype).requires_grad_()
    params = (make(n, K), make(n, K, d), make(vocab, d), make(vocab) if bias else None)
    labels = torch.randint(0, vocab, (n,), generator=g)
    labels[::3] = -100
    return params, labels


def naive_loss(prior_logits, latents, weight, bias, labels):
    """`-sum_i log(sum_j pi_j softmax(W k_j + b)[y_i])`, probabilities mixed, fp32."""
    bias = None if bias is None else bias.float()
    probs = F.linear(latents.float(), weight.float(), bias).softmax(-1)
    mixed = (prior_logits.float().softmax(-1).unsqueeze(-1) * probs).sum(-2)
    return F.nll_loss(mixed.log(), labels, reduction="sum")  # ignore_index=-100


def fused_loss(prior_logits, latents, weight, bias, labels, **kwargs):
    return losses.mixture_nll_sum(prior_logits.float().log_softmax(-1), latents, weight, bias, labels, **kwargs)


def grads(loss, params):
    return torch.autograd.grad(0.37 * loss, [p for p in params if p is not None])  # a scaled upstream


@pytest.mark.parametrize("chunk_rows", [4, None])
@pytest.mark.parametrize("bias", [True, False])
def test_fused_mixture_loss_equals_naive_values_and_gradients(chunk_rows, bias):
    params, labels = mixture_problem(bias=bias)
    want, want_grads = naive_loss(*params, labels), grads(naive_loss(*params, labels), params)
    got = fused_loss(*params, labels, chunk_rows=chunk_rows)
    direct = losses.FusedMixtureNLL.apply(params[0].log_softmax(-1), *params[1:], labels, -100, 4,  # ignored rows kept
                                          torch.float32, False)
    for loss in (got, direct):
        assert loss.dtype == torch.float32 and loss.shape == ()
        torch.testing.assert_close(loss, want, rtol=1e-5, atol=1e-5)
        loss_grads = grads(loss, params)
        for g_got, g_want in zip(loss_grads, want_grads):
            torch.testing.assert_close(g_got, g_want, rtol=1e-5, atol=1e-5)
        assert torch.all(loss_grads[1][labels == -100] == 0)  # ignored rows get no gradient


def test_all_ignored_batch_gives_zero_loss_and_zero_gradients():
    params, labels = mixture_problem()
    labels[:] = -100
    direct = losses.FusedMixtureNLL.apply(*params, labels, -100, 4, torch.float32, False)
    for loss in (fused_loss(*params, labels), direct):
        assert loss.item() == 0
        assert all(torch.equal(g, torch.zeros_like(g)) for g in torch.autograd.grad(loss, params))


def test_inputs_without_gradients():
    params, labels = mixture_problem()
    frozen = [p.detach() for p in params]
    got = fused_loss(*frozen, labels)
    assert got.grad_fn is None
    torch.testing.assert_close(got, naive_loss(*params, labels).detach(), rtol=1e-5, atol=1e-5)
    with torch.no_grad():
        torch.testing.assert_close(fused_loss(*params, labels), got)
    latents_only = fused_loss(*frozen[:1], params[1], *frozen[2:], labels)  # only the latents learn
    (g_latents,) = torch.autograd.grad(latents_only, [params[1]])
    torch.testing.assert_close(g_latents, torch.autograd.grad(naive_loss(*params, labels), [params[1]])[0],
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype, tolerance", [(torch.bfloat16, 2e-2), (torch.float16, 2e-3)])
def test_low_precision_is_close_to_fp32_and_keeps_the_input_dtypes(dtype, tolerance):
    params, labels = mixture_problem(dtype=dtype)
    exact, _ = mixture_problem()  # the same draws before rounding
    got = fused_loss(*params, labels)
    got_grads = grads(got, params)
    assert got.dtype == torch.float32 and [g.dtype for g in got_grads] == [dtype] * 4
    torch.testing.assert_close(got, naive_loss(*exact, labels), rtol=tolerance, atol=0)
    for g_got, g_want in zip(got_grads, grads(naive_loss(*exact, labels), exact)):
        torch.testing.assert_close(g_got.float(), g_want, rtol=tolerance, atol=tolerance)


class Recorder(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


def test_backward_recomputes_nothing(monkeypatch):
    """Forward runs each chunk once (its products: scores, dk, dW and db); backward only scales."""
    calls, chunk = [], losses._chunk
    monkeypatch.setattr(losses, "_chunk", lambda *args, **kw: calls.append(1) or chunk(*args, **kw))
    params, labels = mixture_problem()
    with Recorder() as forward:
        loss = fused_loss(*params, labels, chunk_rows=4)
    chunks = -(-labels.numel() // 4)  # every row, ignored ones too: none is picked by a read from the device
    assert len(calls) == chunks and sum(op in PRODUCTS for op in forward.ops) == 4 * chunks
    with Recorder() as backward:
        loss.backward(retain_graph=True)
    assert len(calls) == chunks and backward.ops and not PRODUCTS & set(backward.ops)
    with pytest.raises(RuntimeError, match="forward again"):  # the gradients were handed over
        loss.backward()


def test_traced_loss_is_one_plain_autograd_computation(monkeypatch):
    """Under torch.export / torch.compile no Python loop over rows (sizes stay symbolic)."""
    calls, chunk = [], losses._chunk
    monkeypatch.setattr(losses, "_chunk", lambda *args, **kw: calls.append(1) or chunk(*args, **kw))
    monkeypatch.setattr(losses, "is_traced", lambda: True)
    params, labels = mixture_problem()
    got, want = fused_loss(*params, labels, chunk_rows=4), naive_loss(*params, labels)
    assert len(calls) == 1 and "FusedMixtureNLL" not in type(got.grad_fn).__name__
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    for g_got, g_want in zip(grads(got, params), grads(want, params)):
        torch.testing.assert_close(g_got, g_want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("impl", IMPLS)
def test_summed_linear_cross_entropy_equals_naive(impl):
    x, weight, bias, target = problem()
    want = F.cross_entropy(F.linear(x, weight, bias), target, reduction="sum")
    got = losses.linear_cross_entropy(x, weight, target, bias, chunk_rows=5, impl=impl, reduction="sum")
    assert got.shape == () and got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    for g_got, g_want in zip(grads(got, (x, weight, bias)), grads(want, (x, weight, bias))):
        torch.testing.assert_close(g_got, g_want, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="reduction"):
        losses.linear_cross_entropy(x, weight, target, reduction="mean")


@pytest.mark.parametrize("head, options", [("mos", {"num_components": 3, "tied": True}),
                                           ("doc", {"components": [[-1, 2], [-2, 2]], "regularizer_weight": 0.0})])
def test_lean_mixture_loss_has_the_gradients_of_the_full_log_probs(head, options):
    """Tied: the output matrix is the input embedding, whose gradient sums both uses."""
    model = tiny_model("llama", head, options).train()
    data = batch("llama")
    data["labels"][0, :3] = -100
    results = []
    for return_logits in (None, True):
        model.zero_grad()
        model(**data, return_logits=return_logits).loss.backward()
        results.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    assert results[0].keys() == results[1].keys()
    for name, got in results[0].items():
        torch.testing.assert_close(got, results[1][name], rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("options", [{"num_components": 3}, {"num_components": 3, "tied": True}, {}])
def test_lightrnn_gold_code_loss_has_the_gradients_of_the_full_log_probs(options):
    h = lightrnn_head(**options).train()
    x, labels = lightrnn_inputs(), torch.randint(0, 99, (40,), generator=torch.Generator().manual_seed(2))
    labels[::7] = -100
    full = h(HeadInputs(x.hidden, x.embeddings, return_logits=True), labels).nll_sum
    gold = h(x, labels).nll_sum
    params = [p for p in h.parameters() if p.requires_grad]
    for g_gold, g_full in zip(torch.autograd.grad(gold, params, allow_unused=True),
                              torch.autograd.grad(full, params, allow_unused=True)):
        assert (g_gold is None) == (g_full is None)
        if g_gold is not None:
            torch.testing.assert_close(g_gold, g_full, rtol=1e-4, atol=1e-5)


def test_mos_generation_is_one_call_per_step_and_equals_the_chunked_log_probs(monkeypatch):
    model = tiny_model("llama", "mos", {"num_components": 3})
    calls, mix = [], mixture._mix
    monkeypatch.setattr(mixture, "_mix", lambda *args: calls.append(args[1].shape[0]) or mix(*args))
    prompt = batch("llama")["input_ids"][:, :4]
    out = model.generate(prompt, max_new_tokens=3, min_new_tokens=3, do_sample=False, output_logits=True,
                         return_dict_in_generate=True)
    assert calls == [2, 2, 2]  # one batched call over the 2 rows' K latents per step
    calls.clear()
    monkeypatch.setattr(losses, "LOG_PROBS_CHUNK_ELEMENTS", 3 * 99)  # one row per chunk
    with torch.no_grad():
        full = model(input_ids=out.sequences[:, :-1]).logits
    assert calls == [1] * full.shape[0] * full.shape[1]
    for step, logits in enumerate(out.logits):  # before logits processors
        torch.testing.assert_close(logits, full[:, prompt.shape[1] - 1 + step], rtol=1e-5, atol=1e-5)
