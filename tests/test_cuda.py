"""Every head on a CUDA device: forward and backward (the loss and gradients equal the CPU
model's), cached greedy generation (the CPU model's tokens), save and load (the same logits),
bf16 weights and bf16 autocast; the fused losses on CUDA equal the CPU ones. Skipped without CUDA."""

import pytest
import torch

from head_cases import HEAD_CASES
from tiny import batch, model_class, tiny_model

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

BACKBONES = ["llama", "t5"]
CUDA = torch.device("cuda")


def training_model(backbone, head):
    """In training mode with every dropout off (the heads' dropouts are nn.Dropout modules too),
    so that the CPU and CUDA runs compute the same function."""
    model = tiny_model(backbone, head, HEAD_CASES[head]).train()
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
        elif isinstance(getattr(module, "dropout", None), float):  # attention dropout rates (T5)
            module.dropout = 0.0
    return model


def on(inputs, device):
    return {key: value.to(device) for key, value in inputs.items()}


@pytest.mark.parametrize("backbone", BACKBONES)
@pytest.mark.parametrize("head", sorted(HEAD_CASES))
def test_forward_backward_equals_cpu(head, backbone):
    cpu, gpu = training_model(backbone, head), training_model(backbone, head).to(CUDA)
    inputs = batch(backbone)
    want, got = cpu(**inputs).loss, gpu(**on(inputs, CUDA)).loss
    assert got.device.type == "cuda"
    torch.testing.assert_close(got.cpu(), want, rtol=1e-4, atol=1e-4)
    want.backward()
    got.backward()
    for (name, p_cpu), p_gpu in zip(cpu.named_parameters(), gpu.parameters()):
        if p_cpu.grad is None:
            assert p_gpu.grad is None, name
            continue
        torch.testing.assert_close(p_gpu.grad.cpu(), p_cpu.grad, rtol=1e-3, atol=1e-4, msg=name)


@pytest.mark.parametrize("backbone", BACKBONES)
@pytest.mark.parametrize("head", sorted(HEAD_CASES))
def test_generate_and_save_load(head, backbone, tmp_path):
    cpu = tiny_model(backbone, head, HEAD_CASES[head])
    gpu = tiny_model(backbone, head, HEAD_CASES[head]).to(CUDA)
    prompt = batch(backbone)["input_ids"][:1, :4]
    kwargs = dict(max_new_tokens=5, do_sample=False)
    want = cpu.generate(input_ids=prompt, **kwargs)
    got = gpu.generate(input_ids=prompt.to(CUDA), **kwargs)
    assert got.device.type == "cuda" and torch.equal(got.cpu(), want)
    gpu.save_pretrained(tmp_path)
    loaded = model_class(backbone).from_pretrained(tmp_path).to(CUDA)
    inputs = on(batch(backbone), CUDA)
    with torch.no_grad():
        torch.testing.assert_close(loaded(**inputs).logits, gpu(**inputs).logits, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("head", sorted(HEAD_CASES))
def test_bf16_weights_and_autocast(head):
    fp32 = training_model("llama", head).to(CUDA)
    inputs = on(batch("llama"), CUDA)
    want = fp32(**inputs).loss
    with torch.autocast("cuda", dtype=torch.bfloat16):
        autocast = fp32(**inputs).loss
    autocast.backward()
    assert all(p.grad is None or (p.grad.dtype == torch.float32 and p.grad.isfinite().all())
               for p in fp32.parameters())
    bf16 = training_model("llama", head).to(CUDA, torch.bfloat16)
    low = bf16(**inputs).loss
    low.backward()
    assert all(p.grad is None or (p.grad.dtype == torch.bfloat16 and p.grad.isfinite().all())
               for p in bf16.parameters())
    for loss in (autocast, low):
        assert loss.dtype == torch.float32
        torch.testing.assert_close(loss, want, rtol=5e-2, atol=0)


def test_fused_losses_equal_cpu():
    from test_fused_losses import fused_loss, mixture_problem

    params, labels = mixture_problem(n=300, vocab=1000, d=64)
    want = fused_loss(*params, labels)
    want_grads = torch.autograd.grad(want, params)
    on_gpu = [p.detach().to(CUDA).requires_grad_() for p in params]
    got = fused_loss(*on_gpu, labels.to(CUDA))
    torch.testing.assert_close(got.cpu(), want, rtol=1e-4, atol=1e-4)
    for g_got, g_want in zip(torch.autograd.grad(got, on_gpu), want_grads):
        torch.testing.assert_close(g_got.cpu(), g_want, rtol=1e-3, atol=1e-4)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        low = fused_loss(*on_gpu, labels.to(CUDA))
    torch.testing.assert_close(low.cpu(), want, rtol=2e-2, atol=0)


@pytest.mark.parametrize("sigsoftmax", [False, True])
def test_fused_loss_kernels_equal_cpu_with_sigsoftmax_and_ignored_rows(sigsoftmax):
    """The Triton kernels (`softmax_kernels`) against the CPU's torch path: mixtures, sigsoftmax,
    ignored rows (skipped by the kernels without a host sync)."""
    from test_fused_losses import fused_loss, mixture_problem

    params, labels = mixture_problem(n=300, vocab=1000, d=64)
    want = fused_loss(*params, labels, sigsoftmax=sigsoftmax)
    want_grads = torch.autograd.grad(want, params)
    on_gpu = [p.detach().to(CUDA).requires_grad_() for p in params]
    got = fused_loss(*on_gpu, labels.to(CUDA), sigsoftmax=sigsoftmax)
    torch.testing.assert_close(got.cpu(), want, rtol=1e-4, atol=1e-4)
    for g_got, g_want in zip(torch.autograd.grad(got, on_gpu), want_grads):
        torch.testing.assert_close(g_got.cpu(), g_want, rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("kernel", ["auto", "own", "liger", "cce"])
def test_summed_loss_kernels_equal_the_full_logits_in_bf16(kernel):
    """Every kernel of `linear_cross_entropy(reduction="sum")` under bf16 autocast, bias included
    (CCE's folded into the product), against fp32 logits, to bf16 tolerance."""
    import torch.nn.functional as F

    from hf_outheads import losses, loss_kernels

    if kernel in loss_kernels.PEER_KERNELS and loss_kernels.unavailable(kernel, "cuda"):
        pytest.skip(loss_kernels.unavailable(kernel, "cuda"))
    g = torch.Generator(device=CUDA).manual_seed(0)
    x = (torch.randn(777, 256, device=CUDA, generator=g) * 0.5).requires_grad_()
    weight = (torch.randn(5000, 256, device=CUDA, generator=g) * 0.05).requires_grad_()
    bias = (torch.randn(5000, device=CUDA, generator=g) * 0.1).requires_grad_()
    target = torch.randint(0, 5000, (777,), device=CUDA, generator=g)
    target[::7] = -100
    want = F.cross_entropy(F.linear(x, weight, bias), target, reduction="sum")
    want_grads = torch.autograd.grad(want, (x, weight, bias))
    with torch.autocast("cuda", dtype=torch.bfloat16):
        got = losses.linear_cross_entropy(x, weight, target, bias, impl=kernel, reduction="sum")
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=1e-2, atol=0)
    for name, g_got, g_want in zip(("x", "weight", "bias"), torch.autograd.grad(got, (x, weight, bias)), want_grads):
        scale = g_want.abs().max()
        torch.testing.assert_close(g_got / scale, g_want / scale, rtol=0, atol=3e-2, msg=name)


@pytest.mark.parametrize("kernel", ["auto", "own", "liger", "cce"])
def test_summed_loss_kernels_with_soft_cap_and_z_loss_equal_the_full_logits_in_bf16(kernel):
    """The soft cap (every kernel that takes it) and the z-loss (the own kernels and Liger's; CCE has none)
    against fp32 soft-capped logits, to bf16 tolerance; the z-loss part comes back without gradient."""
    import torch.nn.functional as F

    from hf_outheads import losses, loss_kernels

    if kernel in loss_kernels.PEER_KERNELS and loss_kernels.unavailable(kernel, "cuda"):
        pytest.skip(loss_kernels.unavailable(kernel, "cuda"))
    cap, z_loss = 5.0, 0.0 if kernel == "cce" else 1e-3
    g = torch.Generator(device=CUDA).manual_seed(0)
    x = (torch.randn(777, 256, device=CUDA, generator=g) * 0.5).requires_grad_()
    weight = (torch.randn(5000, 256, device=CUDA, generator=g) * 0.5).requires_grad_()  # scores past the cap
    bias = (torch.randn(5000, device=CUDA, generator=g) * 0.1).requires_grad_()
    target = torch.randint(0, 5000, (777,), device=CUDA, generator=g)
    target[::7] = -100
    scores = cap * torch.tanh(F.linear(x, weight, bias) / cap)
    want_z = z_loss * (scores.logsumexp(-1).square() * (target != -100)).sum()
    want = F.cross_entropy(scores, target, reduction="sum") + want_z
    want_grads = torch.autograd.grad(want, (x, weight, bias))
    with torch.autocast("cuda", dtype=torch.bfloat16):
        got, z = losses.linear_cross_entropy(x, weight, target, bias, impl=kernel, reduction="sum", softcap=cap,
                                             z_loss=z_loss, return_z_loss=True)
    torch.testing.assert_close(got, want.detach(), rtol=1e-2, atol=0)
    if z_loss:
        torch.testing.assert_close(z, want_z.detach(), rtol=2e-2, atol=0)
    for name, g_got, g_want in zip(("x", "weight", "bias"), torch.autograd.grad(got, (x, weight, bias)), want_grads):
        scale = g_want.abs().max()
        torch.testing.assert_close(g_got / scale, g_want / scale, rtol=0, atol=3e-2, msg=name)


@pytest.mark.parametrize("head", ["tied", "mos"])  # a peer's kernel; the own kernels behind a graph break
def test_compiled_training_step_equals_eager_on_cuda(head):
    """`torch.compile` on CUDA with the default training loss (`auto`: the fused loss, on the
    fastest kernel installed): the compiled model's loss and gradients are the eager model's."""
    eager = training_model("llama", head).to(CUDA)
    compiled = training_model("llama", head).to(CUDA)
    compiled.load_state_dict(eager.state_dict())
    compiled.compile()
    inputs = on(batch("llama"), CUDA)
    want, got = eager(**inputs).loss, compiled(**inputs).loss
    assert eager(**inputs).logits is None  # training on CUDA: the fused loss, no logits
    want.backward()
    got.backward()
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    for (name, p_eager), p_compiled in zip(eager.named_parameters(), compiled.parameters()):
        if p_eager.grad is not None:
            torch.testing.assert_close(p_compiled.grad, p_eager.grad, rtol=1e-3, atol=1e-4, msg=name)
