"""The from-scratch initialisations chosen by measurement (training/results): heads with
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
    for (_, count), linear in zip(head.groups, head.latents):
        offset = linear.weight - torch.eye(32).repeat(count, 1)
        assert 0.01 < offset.std() < 0.03 and offset.abs().max() < 0.2  # I + N(0, 0.02^2)
        assert torch.count_nonzero(linear.bias) == 0
    assert 0.015 < head.weight.std() < 0.025
    with torch.no_grad():  # uniform prior at the start
        model = scratch(head_type, **options)
        prior = model.head.prior(torch.randn(5, 32)).softmax(-1)
    torch.testing.assert_close(prior, torch.full_like(prior, 1 / prior.shape[-1]))


def test_mixture_paper_form_keeps_the_reference_init():
    head = scratch("mos", num_components=3, tied=True, latent_activation="tanh", latent_init="uniform").head
    bound = 32**-0.5
    assert head.weight is None and torch.count_nonzero(head.prior.weight) > 0
    assert head.latents[0].weight.abs().max() <= bound and (head.latents[0].weight - torch.eye(32).repeat(3, 1)).abs().max() > 0.5


@pytest.mark.parametrize("options, message", [({"init": "eye"}, "'init'"), ({"latent_init": "eye"}, "latent_init")])
def test_unknown_inits_are_errors_naming_the_option(options, message):
    head_type = "bilinear" if "init" in options else "mos"
    with pytest.raises(ValueError, match=message):
        scratch(head_type, **options)
