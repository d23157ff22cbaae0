"""`mos`: Mixture of Softmaxes on causal and seq2seq backbones, its exact loss, its locked
latent dropout, option validation and conversion from pretrained LMs."""

import pytest
import torch

from hf_outheads import OutHeadsConfig, OutHeadsForCausalLM, OutHeadsForSeq2SeqLM
from hf_outheads.tools.conversion import original_lm_head
from hf_outheads.head_mos import MoSHead, MoSOptions
from hf_outheads.head_interface import HeadDims, HeadInputs
from tiny import SEQ2SEQ, batch, tiny_config, tiny_model, tiny_original

OPTIONS = {"num_components": 3}


def prompt(backbone):
    return {"input_ids": batch(backbone)["input_ids"]}


def assert_normalised(logits):
    torch.testing.assert_close(logits.logsumexp(-1), torch.zeros(logits.shape[:-1]), atol=1e-5, rtol=0)


@pytest.mark.parametrize("backbone", ["gpt2", "bart"])
def test_forward_backward_and_generate(backbone):
    model = tiny_model(backbone, "mos", {**OPTIONS, "latent_dropout": 0.2})
    data = batch(backbone)
    with torch.no_grad():
        out = model(**data)
    assert out.logits.shape == (*data["labels"].shape, 99) and out.logits.dtype == torch.float32
    assert_normalised(out.logits)
    assert model.head.returns_log_probs and out.aux_loss is None
    model.train()
    out = model(**data)
    assert out.logits is None and torch.isfinite(out.loss)  # training with labels: loss only
    out.loss.backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.head.parameters())
    model.eval()
    greedy = model.generate(**prompt(backbone), max_new_tokens=4, min_new_tokens=4, do_sample=False)
    beams = model.generate(**prompt(backbone), max_new_tokens=4, min_new_tokens=4, num_beams=3,
                           num_return_sequences=2, do_sample=False, output_scores=True, return_dict_in_generate=True)
    assert greedy.shape[0] == 2 and beams.sequences.shape[0] == 4
    assert torch.isfinite(beams.sequences_scores).all() and (beams.sequences_scores <= 0).all()


@pytest.mark.parametrize("backbone", ["gpt2", "bart"])
def test_logits_to_keep_reaches_the_head(backbone):
    model = tiny_model(backbone, "mos", OPTIONS)
    inputs = dict(batch(backbone))
    inputs.pop("labels") if backbone not in SEQ2SEQ else inputs.update(decoder_input_ids=inputs.pop("labels"))
    seen = []
    model.head.register_forward_pre_hook(lambda module, args: seen.append(args[0].hidden.shape[1]))
    with torch.no_grad():
        full, last = model(**inputs).logits, model(**inputs, logits_to_keep=1).logits
    assert seen == [full.shape[1], 1]
    torch.testing.assert_close(last, full[:, -1:], rtol=1e-5, atol=1e-6)


def test_exact_training_loss_equals_loss_of_the_logits():
    """The lean path (no N x K x |V|) gives the same loss and gradients as the full log-probs."""
    model = tiny_model("gpt2", "mos", OPTIONS).train()
    data = batch("gpt2")
    data["labels"][0, :3] = -100
    results = []
    for return_logits in (None, True):
        model.zero_grad()
        torch.manual_seed(5)  # same backbone dropout masks
        out = model(**data, return_logits=return_logits)
        out.loss.backward()
        results.append((out, [p.grad.clone() for p in model.parameters()]))
    (lean, lean_grads), (full, full_grads) = results
    assert lean.logits is None and full.logits is not None
    torch.testing.assert_close(lean.loss, full.loss, rtol=1e-5, atol=1e-6)
    for got, want in zip(lean_grads, full_grads):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)
    with torch.no_grad():
        assert model.eval()(**data, return_logits=False).logits is None


def make_head(kind="locked", rate=0.5, components=4, d=6):
    dims = HeadDims(vocab_size=11, embed_dim=d, hidden_dim=d, num_layers=2)
    head = MoSHead(MoSOptions(num_components=components, latent_dropout=rate, dropout_kind=kind,
                              latent_activation="tanh", map_scale=1.0).resolve(dims), dims)  # stored latent weights = maps
    head.reset_parameters()
    with torch.no_grad():  # constant latents tanh(1): what latent_states returns is the dropout mask
        head.latents[0].weight.zero_()
        head.latents[0].bias.fill_(1.0)
    return head, HeadInputs(hidden=torch.randn(3, 8, d), embeddings=torch.randn(11, d))


def test_dropout_active_in_training_only():
    head, inputs = make_head()
    head.eval()
    torch.testing.assert_close(head(inputs).logits, head(inputs).logits, rtol=0, atol=0)
    torch.testing.assert_close(head.latent_states(inputs), torch.full((3, 8, 4, 6), torch.tanh(torch.tensor(1.0))))
    head.train()
    assert not torch.equal(head(inputs).logits, head(inputs).logits)


def test_locked_mask_per_component_shared_over_time():
    head, inputs = make_head("locked")
    head.train()
    torch.manual_seed(0)
    mask = head.latent_states(inputs) / torch.tanh(torch.tensor(1.0))  # (B=3, T=8, K=4, d=6)
    assert set(mask.unique().tolist()) <= {0.0, 2.0}
    assert torch.equal(mask, mask[:, :1].expand_as(mask)), "one mask per sequence, reused at every time step"
    assert not torch.equal(mask[:, :, 0], mask[:, :, 1]), "each component draws its own mask"
    assert not torch.equal(mask[0], mask[1]), "each sequence draws its own mask"
    head, inputs = make_head("standard")
    head.train()
    mask = head.latent_states(inputs)
    assert not torch.equal(mask, mask[:, :1].expand_as(mask)), "standard dropout varies over time"


@pytest.mark.parametrize(
    "options, message",
    [
        ({"num_components": 0}, "num_components"),
        ({"num_components": 2.5}, "num_components"),
        ({"latent_dim": 16, "tied": True}, "tied=True.*latent_dim"),
        ({"latent_dim": 0}, "latent_dim"),
        ({"latent_init": "zeros"}, "latent_init"),
        ({"latent_activation": "relu"}, "latent_activation"),
        ({"latent_dropout": 1.0}, "latent_dropout"),
        ({"dropout_kind": "variational"}, "dropout_kind"),
        ({"tied": "yes"}, "tied"),
        ({"experts": 3}, "Unknown option"),
    ],
)
def test_invalid_options_are_named(options, message):
    with pytest.raises(ValueError, match=message):
        OutHeadsConfig(text_config=tiny_config("gpt2"), head_type="mos", head_options=options)


def test_untied_latent_dim_and_saved_defaults():
    model = tiny_model("gpt2", "mos", {**OPTIONS, "tied": False, "latent_dim": 16})
    assert model.head.weight.shape == (99, 16) and model.head.latents[0].weight.shape == (3 * 16, 32)
    defaults = OutHeadsConfig(text_config=tiny_config("gpt2"), head_type="mos").head_options
    assert defaults == {"latent_dim": None, "tied": False, "latent_activation": "identity", "latent_dropout": 0.0,
                        "dropout_kind": "locked", "latent_init": "identity", "latent_init_noise": 0.02, "map_scale": 0.01,
                        "num_components": 15, "logit_scale": 1.0, "logit_softcap": 0.0}


def convert(name, **options):
    original = tiny_original(name)
    model_class = OutHeadsForSeq2SeqLM if name in SEQ2SEQ else OutHeadsForCausalLM
    model = model_class.from_backbone(original, head_type="mos", head_options={**OPTIONS, **options}).eval()
    exact = model.head.init_from_lm_head(*original_lm_head(original), model.output_embedding_matrix())
    inputs = dict(batch(name))
    inputs.pop("labels") if name not in SEQ2SEQ else inputs.update(decoder_input_ids=inputs.pop("labels"))
    with torch.no_grad():
        error = (model(**inputs).logits - original(**inputs).logits.float().log_softmax(-1)).abs().max().item()
    return original, model, exact, error


@pytest.mark.parametrize(
    "name, options",
    [
        ("gpt2", {"tied": True}),  # tied original, tied components: E I h
        ("gpt2", {}),  # the defaults: untied, identity latents
        ("llama", {"latent_activation": "identity", "tied": False}),  # untied original
        ("bart", {"latent_activation": "identity", "tied": False, "latent_dim": 40}),  # [W, 0] [I; 0]
        ("t5", {"tied": True}),  # hidden_scale
    ],
)
def test_conversion_is_exact_with_identity_latents(name, options):
    original, model, exact, error = convert(name, **options)
    assert exact and error < 1e-5, error  # measured: 0 to 1e-6
    text = prompt(name)
    assert torch.equal(model.generate(**text, max_new_tokens=5, do_sample=False),
                       original.generate(**text, max_new_tokens=5, do_sample=False))


@pytest.mark.parametrize(
    "name, options, bound",
    [
        ("gpt2", {"latent_activation": "tanh"}, 1e-3),  # tanh(eps h) / eps: measured 7e-5
        ("llama", {"latent_activation": "tanh"}, 1e-3),  # measured 5e-5
        ("llama", {"tied": True}, None),  # least-squares E A ~ W
        ("gpt2", {"tied": True, "latent_activation": "tanh"}, None),  # tanh with tied E cannot be rescaled: measured 0.5
        ("llama", {"tied": False, "latent_dim": 16, "latent_activation": "identity"}, None),  # rank 16 < 32
    ],
)
def test_conversion_approximations_say_so(name, options, bound):
    _, _, exact, error = convert(name, **options)
    assert not exact
    assert bound is None or error < bound, error


def test_converted_components_diverge_after_one_step():
    """Identical components with a random prior: exact at step 0, yet gradients differ per component."""
    _, model, exact, _ = convert("gpt2")
    assert exact and model.head.prior.weight.abs().sum() > 0
    rows = model.head.latents[0].weight.detach().view(3, 32, 32).clone()
    assert torch.equal(rows[0], rows[1])
    optimizer = torch.optim.SGD(model.head.parameters(), lr=0.1)
    model.train()(**batch("gpt2")).loss.backward()
    optimizer.step()
    rows = model.head.latents[0].weight.detach().view(3, 32, 32)
    assert not torch.allclose(rows[0], rows[1])


# ----- map_scale: latent maps stored as (1 - s) I + s A -----
def latent_maps(head) -> torch.Tensor:
    """The effective latent maps `(J * d, d_h)` of a one-group head."""
    eye = torch.eye(head.latent_size, head.dims.hidden_dim).repeat(head.total_components, 1)
    return head.latent_base * eye + head.latent_scale * head.latents[0].weight


@pytest.mark.parametrize("latent_init", ["identity", "uniform"])
def test_map_scale_starts_the_same_function(latent_init):
    ids = batch("gpt2")["input_ids"]
    models = [tiny_model("gpt2", "mos", {**OPTIONS, "latent_init": latent_init, "map_scale": s}) for s in (1.0, 0.1)]
    assert torch.allclose(latent_maps(models[0].head), latent_maps(models[1].head), atol=1e-6)
    with torch.no_grad():
        assert torch.allclose(models[0](input_ids=ids).logits, models[1](input_ids=ids).logits, atol=1e-5)


@pytest.mark.parametrize("scale", [1.0, 0.01])
def test_latent_init_noise_is_the_effective_maps_spread_at_any_map_scale(scale):
    """The identity maps' noise is `latent_init_noise` on the effective maps, whatever `map_scale`;
    without noise every component is the identity, and under the uniform prior the mixture is the
    single softmax over its own matrix (`linear` with the same `W` and bias)."""
    for noise in (0.05, 0.0):
        head = tiny_model("gpt2", "mos", {**OPTIONS, "map_scale": scale, "latent_init_noise": noise}).head
        deviation = latent_maps(head) - torch.eye(head.latent_size, head.dims.hidden_dim).repeat(3, 1)
        assert deviation.std().item() == pytest.approx(noise, rel=0.15, abs=1e-7)
    hidden = torch.randn(2, 5, head.dims.hidden_dim)
    with torch.no_grad():
        logits = head(HeadInputs(hidden, torch.zeros(head.dims.vocab_size, head.dims.embed_dim))).logits
        plain = torch.log_softmax(hidden @ head.weight.T + head.bias, dim=-1)
    torch.testing.assert_close(logits, plain, atol=1e-5, rtol=1e-5)


def test_an_adam_step_moves_the_latent_maps_map_scale_times_as_far():
    ids = batch("gpt2")["input_ids"]
    moved = []
    for scale in (1.0, 0.1):
        model = tiny_model("gpt2", "mos", {**OPTIONS, "map_scale": scale}).train()
        before = latent_maps(model.head).detach().clone()
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
        moved.append((latent_maps(model.head).detach() - before).norm().item())
    assert moved[1] / moved[0] == pytest.approx(0.1, rel=0.05)


@pytest.mark.parametrize("name", ["gpt2", "llama", "bart"])
def test_conversion_is_exact_at_any_map_scale(name):
    _, model, exact, error = convert(name, map_scale=0.1)
    assert model.head.latent_scale == 0.1 and exact and error < 1e-4


def test_a_config_saved_before_map_scale_loads_with_plain_maps(tmp_path):
    import json

    model = tiny_model("gpt2", "mos", {**OPTIONS, "map_scale": 1.0})
    model.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    del config["head_options"]["map_scale"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    loaded = OutHeadsForCausalLM.from_pretrained(tmp_path)
    assert loaded.config.head_options["map_scale"] == 1.0
    ids = batch("gpt2")["input_ids"]
    with torch.no_grad():
        assert torch.allclose(loaded(input_ids=ids).logits, model(input_ids=ids).logits, atol=1e-6)
