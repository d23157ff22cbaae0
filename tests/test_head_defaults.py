"""The from-scratch initialisations chosen by measurement (studies/results): heads with
identity-initialised maps start exactly where `tied` starts, mixtures start from identity
latents and a uniform prior; the papers' inits stay available as options."""

from __future__ import annotations

import pytest
import torch

from tiny import batch, tiny_model


def scratch(head_type: str, **options):
    return tiny_model("gpt2", head_type, options)


@pytest.mark.parametrize("head_type, options", [("bilinear", {}), ("joint", {}),
                                                 ("joint", {"activation": "identity", "joint_dim": 48})])
def test_identity_init_scores_exactly_what_tied_scores(head_type, options):
    tied, other = scratch("tied"), scratch(head_type, **options)
    other.backbone.load_state_dict(tied.backbone.state_dict())
    inputs = batch("gpt2")["input_ids"]
    with torch.no_grad():
        torch.testing.assert_close(other(inputs).logits, tied(inputs).logits, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("head_type, options", [("bilinear", {"init": "uniform"}), ("joint", {"init": "uniform", "activation": "tanh"}),
                                                 ("joint", {"activation": "tanh"})])
def test_paper_inits_and_bounded_activations_do_not_start_at_tied(head_type, options):
    tied, other = scratch("tied"), scratch(head_type, **options)
    other.backbone.load_state_dict(tied.backbone.state_dict())
    inputs = batch("gpt2")["input_ids"]
    with torch.no_grad():
        assert (other(inputs).logits - tied(inputs).logits).abs().max() > 1e-3


@pytest.mark.parametrize("head_type, options", [("mos", {"num_components": 3}),
                                                 ("doc", {"components": [[-1, 2], [1, 1]]})])
def test_mixtures_start_from_identity_latents_a_uniform_prior_and_their_own_output_matrix(head_type, options):
    head = scratch(head_type, **options).head
    assert head.options.tied is False and head.options.latent_activation == "identity"
    assert torch.count_nonzero(head.prior.weight) == 0
    assert head.options.map_scale == 0.01  # the latent maps learn 100x slower than the backbone
    for (_, count), linear in zip(head.groups, head.latents):
        maps = head.latent_base * torch.eye(32).repeat(count, 1) + head.latent_scale * linear.weight  # effective
        offset = maps - torch.eye(32).repeat(count, 1)
        assert 0.01 < offset.std() < 0.03 and offset.abs().max() < 0.2  # I + N(0, 0.02^2)
        assert torch.count_nonzero(linear.bias) == 0
    assert 0.015 < head.weight.std() < 0.025
    with torch.no_grad():  # uniform prior at the start
        model = scratch(head_type, **options)
        prior = model.head.prior(torch.randn(5, 32)).softmax(-1)
    torch.testing.assert_close(prior, torch.full_like(prior, 1 / prior.shape[-1]))


def test_mixture_paper_form_keeps_the_reference_init():
    model = scratch("mos", num_components=3, tied=True, latent_activation="tanh", latent_init="uniform", map_scale=1.0)
    head, bound = model.head, 32**-0.5
    assert "weight" not in head._parameters and head.weight is model.get_input_embeddings().weight  # tied: W is E
    assert torch.count_nonzero(head.prior.weight) > 0
    assert head.latents[0].weight.abs().max() <= bound and (head.latents[0].weight - torch.eye(32).repeat(3, 1)).abs().max() > 0.5


@pytest.mark.parametrize("options, message", [({"init": "eye"}, "'init'"), ({"latent_init": "eye"}, "latent_init")])
def test_unknown_inits_are_errors_naming_the_option(options, message):
    head_type = "bilinear" if "init" in options else "mos"
    with pytest.raises(ValueError, match=message):
        scratch(head_type, **options)


@pytest.mark.parametrize("head_type, attr", [("bilinear", "map"), ("joint", "in_proj"), ("joint", "out_proj")])
def test_an_adam_step_moves_a_map_map_scale_times_as_far_as_a_plain_parameter(head_type, attr):
    """`W = I + map_scale * A`: Adam moves every entry of A by about lr, so W by map_scale * lr."""
    inputs = batch("gpt2")["input_ids"]
    moves = {}
    for scale in (1.0, 0.01):
        model = scratch(head_type, map_scale=scale).train()
        optimizer = torch.optim.Adam(model.head.parameters(), lr=1e-3)
        before = getattr(model.head, attr).effective_weight().detach().clone()
        model(inputs, labels=inputs).loss.backward()
        optimizer.step()
        moves[scale] = (getattr(model.head, attr).effective_weight() - before).abs().max().item()
    assert moves[1.0] == pytest.approx(1e-3, rel=1e-2)
    assert moves[0.01] == pytest.approx(1e-5, rel=1e-2)


def test_the_paper_init_of_a_scaled_map_is_uniform_whatever_the_scale():
    for scale in (1.0, 0.01):
        weight = scratch("bilinear", init="uniform", map_scale=scale).head.map.effective_weight()
        assert weight.abs().max() <= 0.1 + 1e-6 and weight.std() > 0.05


def test_the_head_does_not_change_the_backbone_init_or_the_random_state_after_it():
    """Comparisons at one seed differ only by the head: its init runs on a forked random state."""
    states = {}
    for head_type, options in (("tied", {}), ("linear", {}), ("mos", {"num_components": 3}), ("joint", {"init": "uniform"})):
        model = scratch(head_type, **options)
        states[head_type] = (model.backbone.state_dict(), torch.rand(4))
    reference, after = states.pop("tied")
    for backbone, drawn in states.values():
        assert all(torch.equal(backbone[key], value) for key, value in reference.items())
        assert torch.equal(drawn, after)


@pytest.mark.parametrize("head_type, attr, from_scratch", [("bilinear", "map", 0.1), ("joint", "in_proj", 0.01)])
def test_map_scale_left_unset_is_slower_from_scratch_and_1_when_converted(head_type, attr, from_scratch):
    """The maps learn 10x (bilinear) or 100x (joint) slower from scratch, at the full rate when
    converted from a trained `tied` head (all measured); a value given is kept either way, and
    the config states it."""
    from tiny import model_class, tiny_original

    assert scratch(head_type).config.head_options["map_scale"] == from_scratch
    cls = model_class("gpt2")
    for given, want in (({}, 1.0), ({"map_scale": None}, 1.0), ({"map_scale": 0.01}, 0.01)):
        model = cls.from_backbone(tiny_original("gpt2"), head_type=head_type, head_options=given)
        assert model.config.head_options["map_scale"] == want
        assert getattr(model.head, attr).scale == want
    assert scratch(head_type, map_scale=0.5).config.head_options["map_scale"] == 0.5


def test_drill_dropout_left_unset_is_01_from_scratch_and_0_when_converted():
    """Measured: a converted drill fine-tunes better without its label-encoder dropout."""
    from tiny import model_class, tiny_original

    assert scratch("drill").config.head_options["dropout"] == 0.1
    cls = model_class("gpt2")
    for given, want in (({}, 0.0), ({"dropout": None}, 0.0), ({"dropout": 0.2}, 0.2)):
        model = cls.from_backbone(tiny_original("gpt2"), head_type="drill", head_options=given)
        assert model.config.head_options["dropout"] == want and model.head.dropout.p == want


@pytest.mark.parametrize("in_dim, out_dim", [(8, 8), (8, 5), (5, 8)])
@pytest.mark.parametrize("init", ["identity", "uniform"])
def test_a_scaled_map_computes_its_effective_linear_map(in_dim, out_dim, init):
    """`forward` never builds `base I + scale A`; it must equal `F.linear` with it, for
    square and semi-identity shapes (gradients included)."""
    from hf_outheads.head_joint import JointOptions

    torch.manual_seed(0)
    layer = JointOptions(init=init, map_scale=0.1).scaled_map(in_dim, out_dim, True, gain=2.0)
    layer.reset()
    with torch.no_grad():
        layer.weight.normal_()
        layer.bias.normal_()
    x = torch.randn(3, 4, in_dim, dtype=torch.float64, requires_grad=True)
    layer.double()
    got = layer(x)
    want = torch.nn.functional.linear(x, layer.effective_weight(), layer.bias)
    torch.testing.assert_close(got, want)
    grads = torch.autograd.grad(got.square().sum(), [x, layer.weight, layer.bias])
    for g, w in zip(grads, torch.autograd.grad(want.square().sum(), [x, layer.weight, layer.bias])):
        torch.testing.assert_close(g, w)


@pytest.mark.parametrize("in_dim, d", [(8, 8), (8, 5), (5, 8)])
def test_a_latent_scaled_map_is_the_same_formula_with_copies_and_a_scaled_bias(in_dim, d):
    """The mixtures' latent maps are `ScaledMap`s too: 3 copies of the identity, `base = 1 - s`,
    bias `s c`; forward equals `F.linear` with `effective_weight()` and the bias `s c`, and
    `set_effective_weight` stores a given map whatever `s`."""
    from hf_outheads.scaled_map import ScaledMap

    torch.manual_seed(0)
    layer = ScaledMap(in_dim, 3 * d, True, 0.1, 0.9, copies=3, scaled_bias=True).double()
    with torch.no_grad():
        layer.weight.normal_()
        layer.bias.normal_()
    x = torch.randn(2, 4, in_dim, dtype=torch.float64)
    want = torch.nn.functional.linear(x, layer.effective_weight(), 0.1 * layer.bias)
    torch.testing.assert_close(layer(x), want)
    eye = torch.eye(d, in_dim, dtype=torch.float64).repeat(3, 1)
    torch.testing.assert_close(layer.effective_weight(), 0.9 * eye + 0.1 * layer.weight)
    target = torch.randn(3 * d, in_dim, dtype=torch.float64)
    layer.set_effective_weight(target)
    torch.testing.assert_close(layer.effective_weight(), target)


def test_every_head_with_scaled_maps_states_its_map_scale_defaults():
    """A head whose options declare `map_scale` states in its options class what an unset one is:
    from scratch a rate in (0, 1], converted from a trained head the full rate (1)."""
    from hf_outheads import HEAD_CLASSES, HeadDims
    from hf_outheads.scaled_map import MapScaleOptions

    dims = HeadDims(vocab_size=99, embed_dim=32, hidden_dim=32, num_layers=2)
    with_maps = {name: cls.Options for name, cls in HEAD_CLASSES.items() if issubclass(cls.Options, MapScaleOptions)}
    assert {"bilinear", "joint", "mos", "doc", "lightrnn"} <= set(with_maps)
    for name, options in with_maps.items():
        given = HEAD_CLASSES[name].contract_options
        scratch = options.from_dict(given).resolve(dims).map_scale
        converted = options.from_dict(given).for_conversion().resolve(dims).map_scale
        assert isinstance(scratch, float) and 0 < scratch <= 1 and converted == 1.0, (name, scratch, converted)
