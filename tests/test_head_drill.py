"""`drill` (Pappas & Henderson 2019): model behaviour, its equations' properties, dropout,
conversion from pretrained LMs and option validation."""

import pytest
import torch

from hf_outheads import HeadDims, OutHeadsConfig
from hf_outheads import head_drill
from hf_outheads.head_drill import DrillHead, DrillOptions, LabelDropout, keep_mask
from label_encoder_checks import (
    check_generate, check_logits_to_keep, check_save_load, check_train_step, convert, decoder_inputs,
    max_log_prob_error, mean_kl,
)
from tiny import model_class, tiny_config, tiny_model, tiny_original

TINY = {"depth": 2, "dropout": 0.3, "dropout_kind": "standard"}
DIMS = HeadDims(vocab_size=99, embed_dim=32, hidden_dim=32, num_layers=2)


@pytest.mark.parametrize("name", ["gpt2", "bart"])
def test_trains_generates_keeps_logits_and_round_trips(name, tmp_path):
    model = tiny_model(name, "drill", TINY)
    check_train_step(model, name)
    check_generate(model, name)
    check_logits_to_keep(model, name)
    check_save_load(model, name, tmp_path)


@pytest.mark.parametrize("name", ["gpt2", "bart"])
def test_depth_zero_is_the_tied_head(name):
    tied = tiny_model(name, "tied", seed=0)
    with torch.no_grad():
        tied.head.bias.normal_()
    drill = tiny_model(name, "drill", {"depth": 0}, seed=1)
    drill.load_state_dict(tied.state_dict())
    inputs = decoder_inputs(name)
    with torch.no_grad():
        assert torch.equal(drill(**inputs).logits, tied(**inputs).logits)


def head(**options) -> DrillHead:
    torch.manual_seed(0)
    module = DrillHead(DrillOptions(**{"dropout": 0.0, **options}).resolve(DIMS), DIMS)
    module.reset_parameters()
    return module


def test_label_encoder_follows_eq_9_and_10():
    E = torch.randn(99, 32)
    for previous in (False, True):
        h = head(depth=3, activation="tanh", residual_previous=previous)
        want = E
        for i, layer in enumerate(h.layers):
            want = torch.tanh(want @ layer.weight.T + layer.bias) + E + (want if previous and i > 0 else 0)
        torch.testing.assert_close(h.label_matrix(E), want)


@pytest.mark.parametrize("position", ["input", "output"])
@pytest.mark.parametrize("kind", ["locked", "standard"])
def test_dropout_is_active_in_training_and_absent_in_eval(kind, position):
    E = torch.randn(99, 32)
    h = head(dropout=0.5, dropout_kind=kind, dropout_position=position)
    plain = head(dropout=0.0)
    h.train()
    assert not torch.equal(h.label_matrix(E), h.label_matrix(E))
    h.eval()
    assert torch.equal(h.label_matrix(E), plain.label_matrix(E))


def zero_columns_shared_by_all_rows(x: torch.Tensor) -> bool:
    zeros = x == 0
    return bool(zeros.any() and torch.equal(zeros.all(dim=0), zeros.any(dim=0)))


def test_locked_mask_is_one_row_shared_by_the_whole_vocabulary():
    x = torch.rand(99, 32) + 1.0  # no zeros of its own
    locked, standard = LabelDropout(0.5, "locked").train(), LabelDropout(0.5, "standard").train()
    dropped = locked(x)
    assert zero_columns_shared_by_all_rows(dropped)
    assert not torch.equal(dropped, locked(x))  # a new mask per call (per forward)
    assert not zero_columns_shared_by_all_rows(standard(x))
    kept = dropped != 0
    torch.testing.assert_close(dropped[kept], (x * 2)[kept])  # inverted scaling by 1 / (1 - p)


def unfused_layer(x, layer, activation, embeddings, kind, p):
    """`act(layer(drop(x))) + E` composed of autograd's ops, with the mask the fused layer draws
    from the same generator state."""
    if kind == "standard" and p > 0:
        keep, p = keep_mask(x.shape, p)
        x = x * keep / (1 - p)
    elif kind == "locked" and p > 0:
        x = x * LabelDropout(p, kind).column_mask(x)
    return getattr(torch, activation)(layer(x)) + embeddings


@pytest.mark.parametrize("activation", ["relu", "sigmoid", "tanh"])
@pytest.mark.parametrize("kind, p", [("standard", 0.3), ("standard", 0.0), ("locked", 0.3)])
@pytest.mark.parametrize("first", [True, False])
def test_fused_layer_equals_dropout_linear_activation_and_residual(activation, kind, p, first):
    """Values and gradients (x, W, b, E; x is E itself in the first layer) equal the layer
    composed of autograd's ops with the same mask."""
    E = torch.randn(50, 16, dtype=torch.float64, requires_grad=True)
    x = E if first else torch.randn(50, 16, dtype=torch.float64, requires_grad=True)
    layer = torch.nn.Linear(16, 16).double()
    dropout = LabelDropout(p, kind).train()
    inputs = [x, layer.weight, layer.bias] + ([] if first else [E])
    torch.manual_seed(0)
    fused = dropout.residual_layer(x, layer, activation, E)
    torch.manual_seed(0)
    reference = unfused_layer(x, layer, activation, E, kind, p)
    torch.testing.assert_close(fused, reference)
    grad = torch.randn_like(fused)
    for got, want in zip(torch.autograd.grad(fused, inputs, grad), torch.autograd.grad(reference, inputs, grad)):
        torch.testing.assert_close(got, want)


def test_fused_layer_keeps_byte_masks_and_works_under_autocast():
    """Saved for backward: the dropped input (the only float `|V| x d` matrix), a bool keep
    mask and relu's bool derivative. Under bf16 autocast the gradients are float32 and finite."""
    x = torch.randn(50, 16, requires_grad=True)
    layer = torch.nn.Linear(16, 16)
    dropout = LabelDropout(0.3, "standard").train()
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        dropout.residual_layer(x, layer, "relu", x)
    assert sorted(str(t.dtype) for t in saved if t.numel() == x.numel()) == ["torch.bool", "torch.bool", "torch.float32"]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = dropout.residual_layer(x, layer, "relu", x)
    out.float().sum().backward()
    assert x.grad.dtype == layer.weight.grad.dtype == torch.float32
    assert torch.isfinite(x.grad).all() and torch.isfinite(layer.weight.grad).all()


def test_keep_mask_drops_each_element_independently_at_rate_p():
    """Every 16-bit lane of the 64-bit draws is uniform (a lane that never drops, e.g. from a
    sign bit always 0, would show), and neighbouring lanes are independent."""
    torch.manual_seed(0)
    keep, p = keep_mask(torch.Size([4096, 256]), 0.1)
    dropped = ~keep
    assert p == round(0.1 * 65536) / 65536
    for lane in range(4):  # columns lane, lane + 4, ...: one lane of every 64-bit draw
        assert abs(dropped[:, lane::4].float().mean().item() - p) < 3e-3
    both = (dropped[:, 0::2] & dropped[:, 1::2]).float().mean().item()
    assert abs(both - p * p) < 1e-3
    assert keep_mask(torch.Size([7, 3]), 0.0)[0].all() and keep_mask(torch.Size([5]), 0.5)[0].shape == (5,)


def test_locked_mask_in_the_head_input_and_output_positions(monkeypatch):
    """Input position (reference code): the first layer sees E with whole columns dropped,
    which it computes by zeroing whole columns of W (equal values: the fused-layer test).
    Output position (Eq. 12): f_1's output has whole columns dropped, so E^(1) - E does."""
    E = torch.rand(99, 32) + 1.0
    weights = []
    apply = head_drill._ResidualLayer.apply
    monkeypatch.setattr(head_drill._ResidualLayer, "apply", lambda x, w, *rest: weights.append(w) or apply(x, w, *rest))
    h = head(depth=1, activation="sigmoid", dropout=0.5, dropout_kind="locked", dropout_position="input").train()
    h.label_matrix(E)
    assert zero_columns_shared_by_all_rows(weights[0]) and not (h.layers[0].weight == 0).any()
    h = head(depth=1, activation="sigmoid", dropout=0.5, dropout_kind="locked", dropout_position="output").train()
    assert zero_columns_shared_by_all_rows(h.label_matrix(E) - E)
    h = head(depth=1, activation="sigmoid", dropout=0.5, dropout_kind="standard", dropout_position="output").train()
    assert not zero_columns_shared_by_all_rows(h.label_matrix(E) - E)


@pytest.mark.parametrize("name", ["gpt2", "bart"])
@pytest.mark.parametrize("activation", ["relu", "tanh", "sigmoid"])
def test_conversion_keeps_the_next_token_distribution(name, activation):
    exact, want, got = convert(name, "drill", {"depth": 2, "activation": activation})
    assert exact
    assert max_log_prob_error(want, got) < 1e-5
    shift = got - want  # relu(1/sqrt(d)), sigmoid(0) = 1/2 move every logit of a position equally
    if activation != "tanh":
        torch.testing.assert_close(shift, shift[..., :1].expand_as(shift), rtol=0, atol=1e-5)
    else:
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("activation", ["relu", "tanh", "sigmoid"])
def test_converted_tied_head_learns(activation):
    """From a tied original the branches start at a constant; their weights must still get
    gradients (relu at exactly 0 would give none, and the head would stay `tied` forever).
    Layer 1 feeds layer 2 only through `U_2 = 0`, so it gets them from the second step on."""
    original = tiny_original("gpt2")
    model = model_class("gpt2").from_backbone(original, head_type="drill", head_options={"depth": 2, "activation": activation})
    ids = decoder_inputs("gpt2")["input_ids"]
    optimizer = torch.optim.SGD(model.head.parameters(), lr=1.0)
    model.train()
    for _ in range(2):
        optimizer.zero_grad()
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
    assert all(layer.weight.grad.abs().max() > 0 for layer in model.head.layers)


def test_conversion_with_residual_to_previous_layer():
    """Layers >= 2 must cancel E^(i-1): exact for relu, small error for small embeddings otherwise."""
    exact, want, got = convert("gpt2", "drill", {"depth": 3, "activation": "relu", "residual_previous": True})
    assert exact and max_log_prob_error(want, got) < 1e-5
    for activation, bound in (("tanh", 2e-3), ("sigmoid", 5e-3)):  # measured 5e-4, 2e-3
        exact, want, got = convert("gpt2", "drill", {"depth": 3, "activation": activation, "residual_previous": True})
        assert not exact and max_log_prob_error(want, got) < bound


def test_conversion_of_an_untied_head_uses_it():
    """Llama's lm_head is not E: the least-squares start is closer to it than E alone (depth 0)."""
    exact, want, got = convert("llama", "drill", {"depth": 2, "activation": "relu"})
    assert not exact
    _, _, embeddings_only = convert("llama", "drill", {"depth": 0})
    assert mean_kl(want, got) < 0.5 * mean_kl(want, embeddings_only)


@pytest.mark.parametrize(
    "options, message",
    [
        ({"depth": -1}, "'depth' must be an integer >= 0"),
        ({"depth": 1.5}, "'depth' must be an integer >= 0"),
        ({"activation": "gelu"}, "'activation'='gelu' is not one of"),
        ({"dropout": 1.0}, "'dropout' must be in \\[0, 1\\)"),
        ({"dropout": -0.1}, "'dropout' must be in \\[0, 1\\)"),
        ({"dropout_kind": "gaussian"}, "'dropout_kind'"),
        ({"dropout_position": "middle"}, "'dropout_position'"),
        ({"width": 3}, "Unknown option"),
    ],
)
def test_invalid_options_fail_at_config_construction(options, message):
    with pytest.raises(ValueError, match=message):
        OutHeadsConfig(text_config=tiny_config("gpt2"), head_type="drill", head_options=options)


def test_needs_equal_embedding_and_hidden_widths():
    with pytest.raises(ValueError, match="d=16 must equal the hidden width d_h=32"):
        DrillOptions().resolve(HeadDims(vocab_size=99, embed_dim=16, hidden_dim=32, num_layers=2))


def test_defaults_are_stored_in_the_config():
    config = OutHeadsConfig(text_config=tiny_config("gpt2"), head_type="drill")
    assert config.head_options == {"depth": 2, "activation": "relu", "dropout": 0.1, "dropout_kind": "standard",
                                   "dropout_position": "input", "residual_previous": False, "labels": "embeddings",
                                   "training_loss": "auto", "loss_kernel": "auto", "sampled_fraction": 0.25, "sampled_proposal": "uniform",
                                   "output_bias": True, "logit_scale": 1.0, "logit_softcap": 0.0, "z_loss": 0.0}
