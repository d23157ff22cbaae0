"""`joint` (Pappas, Miculicich & Henderson 2018): model behaviour, the ablation forms,
conversion from pretrained LMs and option validation."""

import pytest
import torch

from hf_outheads import HeadDims, OutHeadsConfig
from hf_outheads.head_joint import JointHead, JointOptions
from label_encoder_checks import (
    check_generate, check_logits_to_keep, check_save_load, check_train_step, convert, decoder_inputs,
    max_log_prob_error, mean_kl,
)
from tiny import tiny_config, tiny_model

DIMS = HeadDims(vocab_size=99, embed_dim=32, hidden_dim=32, num_layers=2)


@pytest.mark.parametrize("name", ["gpt2", "bart"])
def test_trains_generates_keeps_logits_and_round_trips(name, tmp_path):
    model = tiny_model(name, "joint", {"joint_dim": 16})
    check_train_step(model, name)
    check_generate(model, name)
    check_logits_to_keep(model, name)
    check_save_load(model, name, tmp_path)


def head(**options) -> JointHead:
    torch.manual_seed(0)
    module = JointHead(JointOptions(**options).resolve(DIMS), DIMS)
    module.reset_parameters()
    return module


@pytest.mark.parametrize(
    "form, formula",
    [
        ("both", lambda h, E, x: torch.tanh(h.out_proj(E)) @ torch.tanh(h.in_proj(x)).T),  # Eq. 14/15
        ("output", lambda h, E, x: torch.tanh(h.out_proj(E)) @ x.T),  # Eq. 7a
        ("context", lambda h, E, x: E @ torch.tanh(h.in_proj(x)).T),  # Eq. 7b
        ("bilinear", lambda h, E, x: E @ (x @ h.in_proj.effective_weight().T).T),  # Eq. 6
    ],
)
def test_forms_compute_the_papers_equations(form, formula):
    module = head(form=form, activation="tanh", joint_dim=None if form != "both" else 24)
    with torch.no_grad():
        module.bias.normal_()
    E, x = torch.randn(99, 32), torch.randn(5, 32)
    got = module.label_matrix(E) @ module.context(x).T
    torch.testing.assert_close(got, formula(module, E, x))
    assert (module.in_proj is None) == (form == "output")
    assert (module.out_proj is None) == (form in ("context", "bilinear"))


@pytest.mark.parametrize("form", ["both", "output", "context", "bilinear"])
@pytest.mark.parametrize("name", ["gpt2", "bart"])
def test_identity_activation_and_projections_is_the_tied_head(name, form):
    """Eq. 18: with g_in = g_out = I the joint space is weight tying."""
    tied = tiny_model(name, "tied", seed=0)
    with torch.no_grad():
        tied.head.bias.normal_()
    joint = tiny_model(name, "joint", {"activation": "identity", "form": form}, seed=1)
    joint.load_state_dict(tied.state_dict(), strict=False)
    with torch.no_grad():
        for proj in (joint.head.out_proj, joint.head.in_proj):
            if proj is not None:
                proj.set_effective_weight(torch.eye(32))
                if proj.bias is not None:
                    proj.bias.zero_()
    inputs = decoder_inputs(name)
    with torch.no_grad():
        assert torch.equal(joint(**inputs).logits, tied(**inputs).logits)


@pytest.mark.parametrize(
    "options",
    [
        {"activation": "identity"},
        {"activation": "identity", "joint_dim": 48},  # zero-padded identity projections
        {"activation": "identity", "form": "output"},
        {"activation": "identity", "form": "context"},
        {"form": "bilinear"},
    ],
)
@pytest.mark.parametrize("name", ["gpt2", "bart"])
def test_conversion_is_exact_when_the_form_is_linear(name, options):
    exact, want, got = convert(name, "joint", options)
    assert exact
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_conversion_with_relu_keeps_the_distribution():
    """Relu is shifted onto its linear side: exact for "output"; for "both" wherever the
    context projection stays within three standard deviations (all positions here)."""
    exact, want, got = convert("gpt2", "joint", {"activation": "relu", "form": "output"})
    assert exact and max_log_prob_error(want, got) < 1e-5
    exact, want, got = convert("gpt2", "joint", {"activation": "relu"})
    assert not exact and max_log_prob_error(want, got) < 1e-4


def test_conversion_with_tanh_is_close_and_improves_with_joint_dim():
    """Bounded tanh cannot be exact; the small-scale start errs by 3e-2 (d_j = d) and
    1e-2 (d_j = 4d) in log-probability on tiny GPT-2 (logits up to 0.6)."""
    errors = {}
    for joint_dim in (32, 128):
        exact, want, got = convert("gpt2", "joint", {"joint_dim": joint_dim, "activation": "tanh"})
        assert not exact
        errors[joint_dim] = max_log_prob_error(want, got)
    assert errors[32] < 0.05 and errors[128] < 0.5 * errors[32]


def test_conversion_of_an_untied_head_uses_it():
    """Llama's lm_head is not E: the least-squares start `E M ~= W` is closer than tied E."""
    exact, want, got = convert("llama", "joint", {"activation": "identity"})
    assert not exact
    _, _, embeddings_only = convert("llama", "drill", {"depth": 0})
    assert mean_kl(want, got) < 0.5 * mean_kl(want, embeddings_only)


def test_joint_dim_defaults_to_the_size_each_form_needs():
    config = OutHeadsConfig(text_config=tiny_config("gpt2"), head_type="joint")
    assert config.head_options == {"joint_dim": 32, "activation": "identity", "form": "both", "init": "identity", "map_scale": 0.01,
                                   "labels": "embeddings",
                                   "training_loss": "auto", "loss_kernel": "auto", "sampled_fraction": 0.25, "sampled_proposal": "uniform",
                                   "output_bias": True, "logit_scale": 1.0, "logit_softcap": 0.0, "z_loss": 0.0}
    narrow = HeadDims(vocab_size=99, embed_dim=16, hidden_dim=32, num_layers=2)
    for form, size in (("both", 32), ("output", 32), ("context", 16), ("bilinear", 16)):
        assert JointOptions(form=form).resolve(narrow).joint_dim == size
    JointOptions(joint_dim=2048).resolve(narrow)  # "both" takes any size (paper: 512, 2048, 4096)


@pytest.mark.parametrize(
    "options, message",
    [
        ({"joint_dim": 0}, "'joint_dim' must be an integer >= 1"),
        ({"joint_dim": -4}, "'joint_dim' must be an integer >= 1"),
        ({"joint_dim": 16.5}, "'joint_dim' must be an integer"),
        ({"activation": "gelu"}, "'activation'='gelu' is not one of"),
        ({"form": "dual"}, "'form'='dual' is not one of"),
        ({"form": "output", "joint_dim": 16}, "form 'output' .* joint_dim must equal d_h=32, got 16"),
        ({"form": "context", "joint_dim": 16}, "form 'context' .* joint_dim must equal d=32, got 16"),
        ({"dim": 16}, "Unknown option"),
    ],
)
def test_invalid_options_fail_at_config_construction(options, message):
    with pytest.raises(ValueError, match=message):
        OutHeadsConfig(text_config=tiny_config("gpt2"), head_type="joint", head_options=options)
