"""The fused losses' bf16 path (`losses.mixture_nll_sum`, `linear_cross_entropy(impl="own",
reduction="sum")`): under bf16 autocast or with bf16 weights every matrix product takes bf16
operands, no fp32 copy of the `|V| x d` matrix is made, softmax statistics stay fp32, and the
loss and gradients equal the fp32 path within bf16 tolerance (on CPU). Chunk sizes per device."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from hf_outheads import HEAD_CLASSES, losses
from test_fused_losses import PRODUCTS, fused_loss, grads, mixture_problem, naive_loss
from tiny import batch, tiny_model

VOCAB, D = 23, 6
BF16 = dict(rtol=2e-2, atol=2e-2)


class Recorder(TorchDispatchMode):
    """(op name, input dtypes, output dtype, output shape) of every op."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = [a.dtype for a in args if isinstance(a, torch.Tensor)]
        if isinstance(out, torch.Tensor):
            self.ops.append((func.overloadpacket.__name__, inputs, out.dtype, tuple(out.shape)))
        return out


def recorded_loss(params, labels, autocast: bool):
    with Recorder() as record, torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        loss = fused_loss(*params, labels, chunk_rows=4)
        loss_grads = grads(loss, params)
    return loss, loss_grads, record.ops


MATRIX_PRODUCTS = PRODUCTS - {"addmv", "addmv_", "mv"}  # the bias gradient's matrix-vector product stays fp32


def product_dtypes(ops) -> set:
    return {dtype for name, inputs, _, _ in ops if name in MATRIX_PRODUCTS for dtype in inputs}


def fp32_matrix_copies(ops) -> list:
    return [op for op in ops if op[0] in ("_to_copy", "to", "copy_", "clone") and op[2] == torch.float32
            and op[3] == (VOCAB, D)]


@pytest.mark.parametrize("case", ["autocast", "bf16 weights"])
def test_bf16_products_without_an_fp32_copy_of_the_matrix(case):
    params, labels = mixture_problem(dtype=torch.bfloat16 if case == "bf16 weights" else torch.float32)
    exact, _ = mixture_problem()  # fp32 draws (bf16 weights: the same draws before rounding)
    loss, loss_grads, ops = recorded_loss(params, labels, autocast=case == "autocast")
    assert product_dtypes(ops) == {torch.bfloat16}, product_dtypes(ops)
    assert not fp32_matrix_copies(ops)
    assert any(name == "_log_softmax" and dtype == torch.float32 for name, _, dtype, _ in ops)  # fp32 statistics
    assert loss.dtype == torch.float32
    assert [g.dtype for g in loss_grads] == [p.dtype for p in params]
    want = naive_loss(*exact, labels)
    torch.testing.assert_close(loss, want, **BF16)
    for g_got, g_want in zip(loss_grads, grads(want, exact)):
        torch.testing.assert_close(g_got.float(), g_want, **BF16)


def test_fp32_stays_fp32():
    params, labels = mixture_problem()
    loss, loss_grads, ops = recorded_loss(params, labels, autocast=False)
    assert product_dtypes(ops) == {torch.float32}
    torch.testing.assert_close(loss, naive_loss(*params, labels), rtol=1e-5, atol=1e-5)


def test_chunked_linear_cross_entropy_under_autocast():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(40, D, generator=g, requires_grad=True)
    weight = torch.randn(VOCAB, D, generator=g, requires_grad=True)
    target = torch.randint(0, VOCAB, (40,), generator=g)
    want = losses.linear_cross_entropy(x, weight, target, impl="naive", reduction="sum")
    with Recorder() as record, torch.autocast("cpu", dtype=torch.bfloat16):
        got = losses.linear_cross_entropy(x, weight, target, impl="own", reduction="sum", chunk_rows=8)
    assert product_dtypes(record.ops) == {torch.bfloat16} and not fp32_matrix_copies(record.ops)
    torch.testing.assert_close(got, want, **BF16)
    for g_got, g_want in zip(torch.autograd.grad(got, [x, weight]), torch.autograd.grad(want, [x, weight])):
        torch.testing.assert_close(g_got, g_want, **BF16)


def test_chunk_rows_are_larger_on_cuda():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert losses.fused_chunk_rows(32768, 1, cpu) == 256 and losses.fused_chunk_rows(32768, 1, cuda) == 4096
    assert losses.fused_chunk_rows(128 * 1024, 4, cuda) == 256 and losses.fused_chunk_rows(1000, 4, cuda) == 1024
    assert losses.fused_chunk_rows(10**8, 4, cpu) == 1  # at least one row


@pytest.mark.parametrize("head, options", [("mos", {"num_components": 3, "latent_dropout": 0.0}),
                                           ("lightrnn", {"num_components": 2, "latent_dropout": 0.0})])
def test_mixture_heads_train_under_bf16_autocast_as_in_fp32(head, options):
    model, inputs = tiny_model("llama", head, options).train(), batch("llama")
    want = model(**inputs).loss
    want_grads = torch.autograd.grad(want, list(model.head.parameters()))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = model(**inputs).loss
    got_grads = torch.autograd.grad(got, list(model.head.parameters()))
    torch.testing.assert_close(got, want, rtol=3e-2, atol=0)
    for g_got, g_want in zip(got_grads, want_grads):
        assert g_got.dtype == torch.float32
        torch.testing.assert_close(g_got, g_want, rtol=0.1, atol=0.1 * g_want.abs().max().item())


@pytest.mark.parametrize("head", sorted(HEAD_CLASSES))
def test_fp16_on_large_final_states_is_finite_and_the_fp32_loss(head):
    """With the final norm's output in the thousands (its weight x 3e3), `mos` and
    `doc` in fp16 gave NaN logits, loss and gradients (their latent maps multiplied x by the stored
    `A = (W - base I) / map_scale` before scaling back, past fp16's 65504); `LlamaForCausalLM` and
    every other head stayed finite. Now every head does, at the fp32 model's loss."""
    losses_by_dtype = []
    for dtype in (torch.float32, torch.float16):
        model = tiny_model("llama", head).to(dtype).train()
        with torch.no_grad():
            model.get_decoder().norm.weight.mul_(3e3)
        torch.manual_seed(0)  # the same dropout masks in both
        out = model(**batch("llama"), return_logits=True)
        out.loss.backward()
        assert torch.isfinite(out.logits).all() and torch.isfinite(out.loss), dtype
        assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None), dtype
        losses_by_dtype.append(out.loss.float())
    torch.testing.assert_close(losses_by_dtype[1], losses_by_dtype[0], rtol=1e-3, atol=0)
