"""The fused losses' GPU kernels, checked on a CPU (and on a GPU where there is one): the Triton
kernels of `softmax_kernels` in Triton's interpreter (`TRITON_INTERPRET=1`) on a CPU, compiled on a
GPU, the mixture / sigsoftmax / single-softmax losses
through them against the torch path (fp32 to 1e-5, bf16 to bf16 tolerance), cut-cross-entropy
through its pure-torch reference path (the bias folded into the product), the Liger adapter's
argument order, and the choice of kernel with the peers present and absent. (Liger-Kernel runs on
CUDA only: `tests/test_cuda.py` checks it there.)"""

from __future__ import annotations

import importlib.util
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from hf_outheads import losses, loss_kernels
from hf_outheads.head_interface import training_mode

pytest.importorskip("triton", reason="the kernels need Triton (pip install triton); on a CPU conftest.py sets "
                                      "TRITON_INTERPRET=1")
from hf_outheads.tools import softmax_kernels  # noqa: E402

from test_fused_losses import fused_loss, grads, mixture_problem  # noqa: E402

BF16 = dict(rtol=2e-2, atol=2e-2)
HAS_CCE = importlib.util.find_spec("cut_cross_entropy") is not None
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # where the kernels run


def on_device(params, labels):
    return [None if p is None else p.detach().to(DEVICE).requires_grad_() for p in params], labels.to(DEVICE)


def torch_reference(z, bias, labels, sigsoftmax):
    """The scores `s` the kernels normalise, in fp32."""
    s = z.float() + (0 if bias is None else bias)
    if sigsoftmax:
        s = s + F.logsigmoid(s)
    return s


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("sigsoftmax", [False, True])
@pytest.mark.parametrize("with_bias", [False, True])
def test_kernels_equal_the_torch_statistics_and_gradient(dtype, sigsoftmax, with_bias):
    g = torch.Generator().manual_seed(0)
    vocab = 300  # not a power of two: the last block of a row is masked
    z = (3 * torch.randn(6, vocab, generator=g)).to(dtype).to(DEVICE)
    bias = torch.randn(vocab, generator=g).to(DEVICE) if with_bias else None
    labels = torch.tensor([3, -1, vocab - 1, 0, 17, 150], device=DEVICE)
    scale = torch.rand(6, generator=g).to(DEVICE) * (labels >= 0)  # an ignored row's weight is 0 (the callers')
    lse, target = softmax_kernels.row_stats(z, bias, labels, sigsoftmax)
    s = torch_reference(z, bias, labels, sigsoftmax)
    torch.testing.assert_close(lse, s.logsumexp(-1), rtol=1e-5, atol=1e-5)
    want_target = torch.where(labels >= 0, s.gather(1, labels.clamp_min(0)[:, None])[:, 0], 0.0)
    torch.testing.assert_close(target, want_target, rtol=1e-5, atol=1e-5)
    grad = softmax_kernels.softmax_grad_(z.clone(), bias, labels, lse, scale, sigsoftmax)
    z32 = (z.float() + (0 if bias is None else bias)).requires_grad_()
    scores = z32 + F.logsigmoid(z32) if sigsoftmax else z32
    nll = -(scale * torch.where(labels >= 0, scores.log_softmax(-1).gather(1, labels.clamp_min(0)[:, None])[:, 0], 0))
    nll.sum().backward()
    assert grad.dtype == dtype
    torch.testing.assert_close(grad.float(), z32.grad, **(dict(rtol=1e-5, atol=1e-6) if dtype == torch.float32 else BF16))


def naive_loss(prior_logits, latents, weight, bias, labels, sigsoftmax=False):
    """`-sum_i log(sum_j pi_j q_j[y_i])`, probabilities mixed in fp32; `q_j` the softmax (or
    sigsoftmax) of `W k_j + b`."""
    scores = torch_reference(F.linear(latents.float(), weight.float()), None if bias is None else bias.float(), None,
                             sigsoftmax)
    mixed = (prior_logits.float().softmax(-1).unsqueeze(-1) * scores.softmax(-1)).sum(-2)
    return F.nll_loss(mixed.log(), labels, reduction="sum")  # ignore_index=-100


@pytest.fixture
def kernels(monkeypatch):
    """The fused loss's GPU path (`_chunk_kernels`) on this CPU, through Triton's interpreter."""
    monkeypatch.setattr(losses, "use_triton", lambda device: True)


@pytest.mark.parametrize("sigsoftmax", [False, True])
@pytest.mark.parametrize("bias", [True, False])
def test_mixture_loss_through_the_kernels_equals_the_full_log_probs(kernels, sigsoftmax, bias):
    params, labels = mixture_problem(bias=bias)
    labels[[2, 5, 11]] = -100  # ignored rows: counted nothing, zero gradients, no host sync
    params, labels = on_device(params, labels)
    got = fused_loss(*params, labels, chunk_rows=4, sigsoftmax=sigsoftmax)
    want = naive_loss(*params, labels, sigsoftmax=sigsoftmax)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    for name, g_got, g_want in zip(("prior", "latents", "weight", "bias"), grads(got, params), grads(want, params)):
        torch.testing.assert_close(g_got, g_want, rtol=1e-5, atol=1e-5, msg=name)


def test_mixture_loss_through_the_kernels_in_bf16(kernels):
    params, labels = on_device(*mixture_problem())
    want = naive_loss(*params, labels)
    with torch.autocast(DEVICE.type, dtype=torch.bfloat16):
        got = fused_loss(*params, labels, chunk_rows=5)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want, **BF16)
    for g_got, g_want in zip(grads(got, params), grads(want, params)):
        torch.testing.assert_close(g_got, g_want, **BF16)


def test_all_ignored_rows_through_the_kernels(kernels):
    params, labels = on_device(*mixture_problem())
    loss = fused_loss(*params, torch.full_like(labels, -100), chunk_rows=4)
    assert loss.item() == 0.0
    assert all(not g.any() for g in grads(loss, params))


def single_softmax_problem(n=41, d=13, vocab=37, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g, requires_grad=True)
    weight = (0.3 * torch.randn(vocab, d, generator=g)).requires_grad_()
    bias = torch.randn(vocab, generator=g, requires_grad=True)
    target = torch.randint(0, vocab, (n,), generator=g)
    target[[0, 7]] = -100
    return (x, weight, bias), target


def check_summed_loss(impl, **tolerance):
    params, target = on_device(*single_softmax_problem())
    got = losses.linear_cross_entropy(*params[:2], target, params[2], impl=impl, reduction="sum")
    want = F.cross_entropy(F.linear(*params), target, reduction="sum")
    assert got.dtype == torch.float32 and got.shape == ()
    torch.testing.assert_close(got, want, **tolerance)
    for name, g_got, g_want in zip(("x", "weight", "bias"), grads(got, params), grads(want, params)):
        torch.testing.assert_close(g_got, g_want, msg=name, **tolerance)


def test_own_single_softmax_through_the_kernels(kernels):
    check_summed_loss("own", rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not HAS_CCE, reason="cut-cross-entropy is not installed (pip install cut-cross-entropy)")
@pytest.mark.skipif(DEVICE.type == "cuda", reason="on a GPU CCE's kernel runs in bf16: tests/test_cuda.py")
def test_cce_with_the_bias_folded_into_the_product_equals_naive():
    """On a CPU CCE runs its own pure-torch reference (`impl="torch_compile"`), through the same adapter."""
    check_summed_loss("cce", rtol=1e-4, atol=1e-4)


def test_liger_gets_the_weight_first_and_the_operands_in_the_products_dtype(monkeypatch):
    """Liger's loss module is called as `(weight, x, target, bias)`: a stand-in that checks the
    order and the dtypes (the real kernels run on CUDA only, `tests/test_cuda.py`)."""
    seen = {}

    class StandIn(torch.nn.Module):
        def __init__(self, ignore_index, reduction):
            super().__init__()
            seen.update(ignore_index=ignore_index, reduction=reduction)

        def forward(self, weight, x, target, bias):
            seen.update(dtypes={weight.dtype, x.dtype, bias.dtype}, autocast=torch.is_autocast_enabled("cpu"))
            assert weight.shape[0] == 37 and x.shape[0] == target.shape[0] == 41
            return F.cross_entropy(F.linear(x, weight, bias).float(), target, reduction="sum")

    fake = SimpleNamespace(LigerFusedLinearCrossEntropyLoss=StandIn)
    monkeypatch.setitem(__import__("sys").modules, "liger_kernel.transformers.fused_linear_cross_entropy", fake)
    monkeypatch.setattr(loss_kernels, "unavailable", lambda kernel, device_type: None)
    params, target = single_softmax_problem()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = losses.linear_cross_entropy(*params[:2], target, params[2], impl="liger", reduction="sum")
    assert seen == dict(ignore_index=-100, reduction="sum", dtypes={torch.bfloat16}, autocast=False)
    want = F.cross_entropy(F.linear(*params), target, reduction="sum")
    torch.testing.assert_close(got, want, **BF16)
    assert all(g is not None for g in grads(got, params))


def test_the_kernel_choice_follows_the_measured_order_and_what_is_installed(monkeypatch):
    installed = {"liger", "cce", "torch"}
    monkeypatch.setattr(loss_kernels, "unavailable", lambda kernel, device_type: None if kernel in installed else "absent")
    assert loss_kernels.fastest_kernel("cuda", 32000) == "liger"
    assert loss_kernels.fastest_kernel("cuda", 128000) == "cce"
    assert loss_kernels.fastest_kernel("cpu", 32000) == "torch"
    installed.discard("liger")
    assert loss_kernels.fastest_kernel("cuda", 32000) == "cce"
    installed.clear()
    assert loss_kernels.fastest_kernel("cuda", 32000) == loss_kernels.fastest_kernel("cpu", 99) == "own"


def test_a_missing_or_misplaced_kernel_is_named_in_the_error(monkeypatch):
    params, target = single_softmax_problem()
    with pytest.raises(ValueError, match="'liger' cannot run here: Liger-Kernel runs on CUDA devices only|liger-kernel is"):
        losses.linear_cross_entropy(*params[:2], target, params[2], impl="liger", reduction="sum")
    monkeypatch.setattr(loss_kernels, "installed", lambda name: False)
    with pytest.raises(ValueError, match=r"cut-cross-entropy is not installed \(pip install \"hf_outheads\[gpu\]\"\)"):
        losses.linear_cross_entropy(*params[:2], target, params[2], impl="cce", reduction="sum")
    with pytest.raises(ValueError, match="reduction='sum' only"):
        losses.linear_cross_entropy(*params[:2], target, params[2], impl="cce")


def test_auto_training_loss_is_the_fused_loss_on_cuda_and_the_full_one_elsewhere():
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert training_mode("auto", True, cuda) == "chunked"
    assert training_mode("auto", True, cpu) == "full"
    assert training_mode("auto", False, cuda) == "full"  # evaluation: logits
    assert training_mode("auto", True, cuda, return_logits=True) == "full"
    assert training_mode("full", True, cpu, return_logits=False) == "chunked"
    assert training_mode("sampled", True, cpu, return_logits=False) == "sampled"


CAP, Z_LOSS = 2.0, 1e-2  # scores of about +-3 to +-9 below: far into the cap


def capped_reference(x, weight, bias, target, softcap, z_loss):
    """NLL plus `z_loss * lse^2` per kept row of the soft-capped scores, written out in fp32."""
    scores = F.linear(x.float(), weight.float(), None if bias is None else bias.float())
    scores = softcap * torch.tanh(scores / softcap) if softcap else scores
    keep = target != -100
    z = z_loss * (scores.logsumexp(-1).square() * keep).sum()
    return F.cross_entropy(scores, target, reduction="sum") + z, z


@pytest.mark.parametrize("with_bias", [False, True])
def test_kernels_soft_cap_and_z_loss_equal_the_torch_statistics_and_gradient(with_bias):
    g = torch.Generator().manual_seed(1)
    vocab = 300
    z = (3 * torch.randn(6, vocab, generator=g)).to(DEVICE)
    bias = torch.randn(vocab, generator=g).to(DEVICE) if with_bias else None
    labels = torch.tensor([3, -1, vocab - 1, 0, 17, 150], device=DEVICE)
    scale = (labels >= 0).float()
    lse, target = softmax_kernels.row_stats(z, bias, labels, softcap=CAP)
    s = z + (0 if bias is None else bias)
    capped = CAP * torch.tanh(s / CAP)
    torch.testing.assert_close(lse, capped.logsumexp(-1), rtol=1e-5, atol=1e-5)
    want_target = torch.where(labels >= 0, capped.gather(1, labels.clamp_min(0)[:, None])[:, 0], 0.0)
    torch.testing.assert_close(target, want_target, rtol=1e-5, atol=1e-5)
    grad = softmax_kernels.softmax_grad_(z.clone(), bias, labels, lse, scale, softcap=CAP, z_loss=Z_LOSS)
    z32 = s.clone().requires_grad_()
    capped = CAP * torch.tanh(z32 / CAP)
    gold = capped.log_softmax(-1).gather(1, labels.clamp_min(0)[:, None])[:, 0]
    (-(scale * gold).sum() + Z_LOSS * (scale * capped.logsumexp(-1).square()).sum()).backward()
    torch.testing.assert_close(grad, z32.grad, rtol=1e-5, atol=1e-6)


def check_capped_loss(impl, softcap, z_loss, **tolerance):
    params, target = on_device(*single_softmax_problem())
    with torch.no_grad():
        params[1].mul_(10.0)  # scores far past the cap
    got, z = losses.linear_cross_entropy(*params[:2], target, params[2], impl=impl, reduction="sum", softcap=softcap,
                                         z_loss=z_loss, return_z_loss=True)
    want, want_z = capped_reference(*params, target, softcap, z_loss)
    torch.testing.assert_close(got, want, **tolerance)
    assert (z is None) == (not z_loss) and (z is None or not z.requires_grad)
    if z_loss:
        torch.testing.assert_close(z, want_z.detach(), **tolerance)
    for name, g_got, g_want in zip(("x", "weight", "bias"), grads(got, params), grads(want, params)):
        torch.testing.assert_close(g_got, g_want, msg=name, **tolerance)


@pytest.mark.parametrize("softcap, z_loss", [(CAP, 0.0), (0.0, Z_LOSS), (CAP, Z_LOSS)])
def test_own_single_softmax_with_cap_and_z_loss_through_the_kernels(kernels, softcap, z_loss):
    check_capped_loss("own", softcap, z_loss, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("softcap, z_loss", [(CAP, 0.0), (0.0, Z_LOSS), (CAP, Z_LOSS)])
@pytest.mark.parametrize("impl", ["own", "naive"])
def test_single_softmax_with_cap_and_z_loss_on_the_cpu_path(impl, softcap, z_loss):
    if DEVICE.type == "cuda":
        pytest.skip("the CPU path")
    check_capped_loss(impl, softcap, z_loss, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not HAS_CCE, reason="cut-cross-entropy is not installed (pip install cut-cross-entropy)")
@pytest.mark.skipif(DEVICE.type == "cuda", reason="on a GPU CCE's kernel runs in bf16: tests/test_cuda.py")
def test_cce_takes_the_soft_cap():
    check_capped_loss("cce", CAP, 0.0, rtol=1e-4, atol=1e-4)


def test_mixture_with_capped_components_through_the_kernels(kernels):
    params, labels = on_device(*mixture_problem())
    got = fused_loss(*params, labels, chunk_rows=4, softcap=CAP)
    prior, latents, weight, bias = params
    capped = CAP * torch.tanh(F.linear(latents, weight, bias) / CAP)
    mixed = (prior.log_softmax(-1).unsqueeze(-1) + capped.log_softmax(-1)).logsumexp(-2)
    want = F.nll_loss(mixed, labels, reduction="sum")
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    for name, g_got, g_want in zip(("prior", "latents", "weight", "bias"), grads(got, params), grads(want, params)):
        torch.testing.assert_close(g_got, g_want, rtol=1e-5, atol=1e-5, msg=name)


def test_liger_gets_the_cap_and_the_z_loss_scale(monkeypatch):
    """Liger's `softcap` and `lse_square_scale` (its z-loss, returned apart with `return_z_loss`)."""
    seen = {}

    class StandIn(torch.nn.Module):
        def __init__(self, ignore_index, reduction, softcap, lse_square_scale, return_z_loss):
            super().__init__()
            seen.update(softcap=softcap, lse_square_scale=lse_square_scale, return_z_loss=return_z_loss)

        def forward(self, weight, x, target, bias):
            loss, z = capped_reference(x, weight, bias, target, seen["softcap"], seen["lse_square_scale"])
            return SimpleNamespace(loss=loss, z_loss=z)

    fake = SimpleNamespace(LigerFusedLinearCrossEntropyLoss=StandIn)
    monkeypatch.setitem(__import__("sys").modules, "liger_kernel.transformers.fused_linear_cross_entropy", fake)
    monkeypatch.setattr(loss_kernels, "unavailable", lambda kernel, device_type: None)
    params, target = single_softmax_problem()
    got, z = losses.linear_cross_entropy(*params[:2], target, params[2], impl="liger", reduction="sum", softcap=CAP,
                                         z_loss=Z_LOSS, return_z_loss=True)
    assert seen == dict(softcap=CAP, lse_square_scale=Z_LOSS, return_z_loss=True)
    want, want_z = capped_reference(*params, target, CAP, Z_LOSS)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(z, want_z.detach())
    assert not z.requires_grad


def test_the_kernel_choice_skips_kernels_without_the_cap_or_the_z_loss(monkeypatch):
    monkeypatch.setattr(loss_kernels, "unavailable", lambda kernel, device_type: None)
    assert loss_kernels.fastest_kernel("cpu", 32000, ("softcap",)) == "own"  # torch's takes no cap
    assert loss_kernels.fastest_kernel("cuda", 128000, ("softcap",)) == "cce"
    assert loss_kernels.fastest_kernel("cuda", 128000, ("softcap", "z_loss")) == "liger"  # CCE has no z-loss
    params, target = single_softmax_problem()
    with pytest.raises(ValueError, match="impl='torch' cannot compute this loss: the loss kernel 'torch' takes no softcap"):
        losses.linear_cross_entropy(*params[:2], target, params[2], impl="torch", reduction="sum", softcap=CAP)
    with pytest.raises(ValueError, match="z_loss is a term of the summed training loss"):
        losses.linear_cross_entropy(*params[:2], target, params[2], z_loss=Z_LOSS)
