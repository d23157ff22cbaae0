"""`doc`: Direct Output Connection: middle-layer components, equality with `mos`, the
coefficient-of-variation regulariser (paper Eq. 12-13), the shared locked mask, options."""

import json

import pytest
import torch

from hf_outheads import OutHeadsConfig, OutHeadsForCausalLM, next_token_labels
from hf_outheads.tools.conversion import original_lm_head
from hf_outheads.head_doc import DOCHead, DOCOptions
from hf_outheads.head_interface import HeadDims, HeadInputs
from tiny import SEQ2SEQ, batch, tiny_config, tiny_model, tiny_original

COMPONENTS = [[-1, 2], [1, 1], [0, 1]]  # last layer 2, middle layer 1, embedding output 1


def without_labels(backbone):
    inputs = dict(batch(backbone))
    labels = inputs.pop("labels")
    if backbone in SEQ2SEQ:
        inputs["decoder_input_ids"] = labels
    return inputs


@pytest.mark.parametrize("backbone", ["gpt2", "t5"])
def test_forward_backward_generate_with_middle_layers(backbone):
    model = tiny_model(backbone, "doc", {"components": COMPONENTS, "latent_dropout": 0.3})
    assert model.head.layer_indices == (0, 1) and model.head.total_components == 4
    data = batch(backbone)
    with torch.no_grad():
        out = model(**data)
    torch.testing.assert_close(out.logits.logsumexp(-1), torch.zeros(out.logits.shape[:-1]), atol=1e-5, rtol=0)
    assert out.aux_loss is None  # the regulariser is a training term
    assert getattr(out, "decoder_hidden_states" if backbone in SEQ2SEQ else "hidden_states") is None  # not asked for
    model.train()
    out = model(**data)
    assert out.logits is None and out.aux_loss is not None and out.aux_loss >= 0
    out.loss.backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.head.parameters())
    model.eval()
    prompt = {"input_ids": data["input_ids"]}
    greedy = [model.generate(**prompt, max_new_tokens=4, min_new_tokens=4, do_sample=False, use_cache=c)
              for c in (True, False)]
    assert torch.equal(*greedy)
    beams = model.generate(**prompt, max_new_tokens=4, min_new_tokens=4, num_beams=3, do_sample=False)
    assert beams.shape[0] == 2


@pytest.mark.parametrize("backbone", ["gpt2", "t5"])
def test_logits_to_keep_slices_the_middle_layers_too(backbone):
    model = tiny_model(backbone, "doc", {"components": COMPONENTS})
    seen = []
    model.head.register_forward_pre_hook(
        lambda module, args: seen.append({i: t.shape[1] for i, t in args[0].layers.items()}))
    inputs = without_labels(backbone)
    with torch.no_grad():
        full, last = model(**inputs).logits, model(**inputs, logits_to_keep=1).logits
    assert seen == [{0: full.shape[1], 1: full.shape[1]}, {0: 1, 1: 1}]
    torch.testing.assert_close(last, full[:, -1:], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("backbone", ["gpt2", "t5"])
@pytest.mark.parametrize("last", [-1, 2])
def test_all_components_on_the_last_layer_is_mos(backbone, last):
    mos = tiny_model(backbone, "mos", {"num_components": 3})
    doc = tiny_model(backbone, "doc", {"components": [[last, 3]], "regularizer_weight": 0.0}, seed=1)
    assert doc.head.layer_indices == ()
    doc.load_state_dict(mos.state_dict())  # same parameter names
    data = batch(backbone)
    with torch.no_grad():
        assert torch.equal(doc(**data).logits, mos(**data).logits)
    losses = []
    for model in (mos.train(), doc.train()):
        torch.manual_seed(3)
        losses.append(model(**data).loss)
    assert torch.equal(*losses)


def small_head(regularizer_weight=1.0):
    """d_h = 3, J = 3 (two components on the last layer, one on the embedding output)."""
    dims = HeadDims(vocab_size=5, embed_dim=3, hidden_dim=3, num_layers=2)
    head = DOCHead(DOCOptions(components=[[-1, 2], [0, 1]], regularizer_weight=regularizer_weight).resolve(dims), dims)
    head.reset_parameters()
    with torch.no_grad():
        head.prior.weight.copy_(torch.eye(3))  # prior logits = h
    return head.train()


def test_regulariser_matches_hand_computation():
    """pi rows (0.5, .25, .25), (.2, .3, .5) and an ignored one: B = (.7, .55, .75), mean 2/3,
    population variance ((1/30)^2 + (7/60)^2 + (1/12)^2) / 3 = 13/1800, beta = 13/800."""
    head = small_head()
    pi = torch.tensor([[0.5, 0.25, 0.25], [0.2, 0.3, 0.5], [0.1, 0.1, 0.8]])
    inputs = HeadInputs(hidden=pi.log().unsqueeze(0), embeddings=torch.randn(5, 3), layers={0: torch.randn(1, 3, 3)})
    out = head(inputs, labels=torch.tensor([[1, 4, -100]]))
    torch.testing.assert_close(out.aux_loss, torch.tensor(13 / 800), rtol=1e-5, atol=0)
    head.options.regularizer_weight = 0.001  # the paper's lambda
    torch.testing.assert_close(head(inputs, labels=torch.tensor([[1, 4, -100]])).aux_loss, torch.tensor(0.013 / 800))
    assert head(inputs).aux_loss is None  # no labels
    assert head.eval()(inputs, labels=torch.tensor([[1, 4, -100]])).aux_loss is None  # not in evaluation


def test_model_loss_adds_the_regulariser():
    model = tiny_model("gpt2", "doc", {"components": COMPONENTS, "regularizer_weight": 0.5}).train()
    data = batch("gpt2")
    torch.manual_seed(0)
    out = model(**data)
    torch.manual_seed(0)
    plain = model(**data, return_logits=True)
    torch.testing.assert_close(out.loss, plain.loss)
    nll = torch.nn.functional.cross_entropy(plain.logits[:, :-1].reshape(-1, 99), data["labels"][:, 1:].reshape(-1))
    torch.testing.assert_close(out.loss, nll + out.aux_loss)
    torch.testing.assert_close(out.nll_loss, nll)  # the two terms, returned apart: a loop adds, never subtracts
    assert model.eval()(**data).nll_loss == model(**data).loss  # no training term: loss is the NLL


def test_a_window_of_copies_trains_as_one_batch_with_the_regulariser_once():
    """Given a window's label count (`num_items_in_batch`, as Trainer and `hf_outheads/training/train.py` pass it,
    summed over micro-batches and processes), each micro-batch's loss carries its share of the
    regulariser: a window of two copies of a batch sums to that batch's own loss, the regulariser
    counted once (not once per micro-batch, nor per process under Trainer, which multiplies each
    process's loss by their number before the gradients are averaged)."""
    model = tiny_model("gpt2", "doc", {"components": COMPONENTS, "regularizer_weight": 0.5}).train()
    with torch.no_grad():  # priors off their uniform start, so that the regulariser is not 0
        for parameter in model.head.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.5)
    data = batch("gpt2")
    count = int((data["labels"][:, 1:] != -100).sum())
    torch.manual_seed(0)
    alone = model(**data)
    torch.manual_seed(0)
    half = model(**data, num_items_in_batch=torch.tensor(2 * count))
    assert alone.aux_loss > 0.01
    torch.testing.assert_close(2 * half.loss, alone.loss)
    torch.testing.assert_close(half.aux_loss, alone.aux_loss)  # logged as the batch's own


def test_a_training_forward_without_labels_warns_once_that_the_regulariser_is_not_applied(caplog):
    """Trainer with `label_smoothing_factor` calls the model without labels (see
    test_head_mtp); DOC's regulariser needs them. Warned once in training with gradients; never in
    evaluation, under no_grad (generation) or with regularizer_weight=0."""
    from transformers.utils import logging as hf_logging

    ids = batch("gpt2")["input_ids"]
    quiet = tiny_model("gpt2", "doc", {"components": COMPONENTS, "regularizer_weight": 0.0}).train()
    model = tiny_model("gpt2", "doc", {"components": COMPONENTS})
    hf_logging.warning_once.cache_clear()
    with caplog.at_level("WARNING", logger="hf_outheads"):
        quiet(ids)
        model(ids)
        with torch.no_grad():
            model.train()(ids)
        assert "without labels" not in caplog.text
        model(ids)
        model(ids)
    warnings = [r.getMessage() for r in caplog.records if "without labels" in r.getMessage()]
    assert len(warnings) == 1 and "regulariser" in warnings[0] and "label_smoothing_factor" in warnings[0]


def test_next_token_labels_is_the_causal_shift():
    labels = torch.tensor([[5, 6, 7], [8, -100, 9]])
    assert next_token_labels(labels).tolist() == [[6, 7, -100], [-100, 9, -100]]


def test_one_locked_mask_shared_by_all_components_and_time_steps():
    dims = HeadDims(vocab_size=11, embed_dim=6, hidden_dim=6, num_layers=2)
    head = DOCHead(DOCOptions(components=[[-1, 2], [1, 2], [0, 1]], latent_dropout=0.5, latent_activation="tanh",
                                map_scale=1.0).resolve(dims), dims)
    head.reset_parameters()
    with torch.no_grad():
        for linear in head.latents:
            linear.weight.zero_()
            linear.bias.fill_(1.0)
    inputs = HeadInputs(torch.randn(3, 8, 6), torch.randn(11, 6), {i: torch.randn(3, 8, 6) for i in (0, 1)})
    head.eval()
    assert torch.equal(head.latent_states(inputs), torch.full((3, 8, 5, 6), torch.tanh(torch.tensor(1.0)).item()))
    head.train()
    mask = head.latent_states(inputs) / torch.tanh(torch.tensor(1.0))
    assert set(mask.unique().tolist()) <= {0.0, 2.0}
    assert torch.equal(mask, mask[:, :1, :1].expand_as(mask)), "one mask for all components and time steps"
    assert not torch.equal(mask[0], mask[1])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_inputs_embeds_reach_a_layer_0_component(dtype):
    """An fp32 model given bf16 or fp16 `inputs_embeds` (which the backbone's first
    layer promotes) handed `hidden_states[0]` in the caller's dtype to the head: `mat1 and mat2 must
    have the same dtype`. The head now gets it in the final state's dtype, and scores the rounded
    embeddings as the fp32 copy of them does, to the backbone's own rounding of low-precision input."""
    model = tiny_model("llama", "doc", {"components": COMPONENTS}).train()
    ids = batch("llama")["input_ids"]
    embeds = model.get_input_embeddings()(ids).detach().to(dtype)
    out = model(inputs_embeds=embeds, labels=ids, return_logits=True)
    out.loss.backward()
    assert out.logits.dtype == torch.float32 and torch.isfinite(out.logits).all()
    assert all(torch.isfinite(p.grad).all() for p in model.head.parameters() if p.grad is not None)
    with torch.no_grad():
        want = model(inputs_embeds=embeds.float(), labels=ids).loss
    torch.testing.assert_close(out.loss.detach(), want, rtol=1e-2, atol=0)


def test_middle_layer_norm():
    dims = HeadDims(vocab_size=11, embed_dim=6, hidden_dim=6, num_layers=2)
    g = torch.Generator().manual_seed(0)
    hidden, middle, table = torch.randn(2, 4, 6, generator=g), torch.randn(2, 4, 6, generator=g), torch.randn(11, 6)
    results = {}
    for norm in (True, False):
        torch.manual_seed(0)
        head = DOCHead(DOCOptions(components=[[-1, 1], [1, 2]], middle_layer_norm=norm).resolve(dims), dims).eval()
        head.reset_parameters()
        logits = [head(HeadInputs(hidden, table, {1: scale * middle})).logits
                  for scale in (1.0, 100.0)]
        results[norm] = torch.allclose(*logits, atol=1e-5)
    assert results == {True: True, False: False}  # normalised middle states ignore their scale


def test_components_survive_json_and_save_load(tmp_path):
    model = tiny_model("gpt2", "doc", {"components": {"-1": 2, "1": 1, 0: 1}})
    assert model.config.head_options["components"] == [[-1, 2], [1, 1], [0, 1]]
    assert json.loads(model.config.to_json_string())["head_options"]["components"] == [[-1, 2], [1, 1], [0, 1]]
    model.save_pretrained(tmp_path)
    reloaded = OutHeadsForCausalLM.from_pretrained(tmp_path).eval()
    assert reloaded.head.groups == model.head.groups == ((2, 2), (1, 1), (0, 1))
    inputs = without_labels("gpt2")
    with torch.no_grad():
        assert torch.equal(reloaded(**inputs).logits, model(**inputs).logits)


@pytest.mark.parametrize(
    "options, message",
    [
        ({"components": [[3, 2]]}, "layer 3 does not exist.*0..2"),
        ({"components": [[-4, 2]]}, "layer -4 does not exist"),
        ({"components": [[-1, 2], [2, 1]]}, "names a layer twice"),
        ({"components": [[-1, 0]]}, "count"),
        ({"components": []}, "empty"),
        ({"components": "last"}, "list of \\[layer, count\\] pairs"),
        ({"regularizer_weight": -1.0}, "regularizer_weight"),
        ({"middle_layer_norm": 1}, "middle_layer_norm"),
        ({"latent_dim": 8, "tied": True}, "tied=True.*latent_dim"),
    ],
)
def test_invalid_options_are_named(options, message):
    with pytest.raises(ValueError, match=message):
        OutHeadsConfig(text_config=tiny_config("gpt2"), head_type="doc", head_options=options)


def test_defaults_are_the_papers_except_the_measured_latent_form():
    options = OutHeadsConfig(text_config=tiny_config("gpt2"), head_type="doc").head_options
    assert options["components"] == [[-1, 15], [-2, 5]] and options["regularizer_weight"] == 0.001
    assert (options["tied"], options["latent_activation"], options["latent_init"]) == (False, "identity", "identity")


def test_conversion_exact_only_without_middle_layers():
    original = tiny_original("gpt2")
    lm_head = original_lm_head(original)
    for components, want in (([[-1, 3]], True), (COMPONENTS, False)):
        options = {"components": components, "latent_activation": "identity", "tied": False}
        model = OutHeadsForCausalLM.from_backbone(original, head_type="doc", head_options=options).eval()
        assert model.head.init_from_lm_head(*lm_head, model.output_embedding_matrix()) is want
        inputs = without_labels("gpt2")
        with torch.no_grad():
            error = (model(**inputs).logits - original(**inputs).logits.log_softmax(-1)).abs().max().item()
        assert (error < 1e-5) is want, error  # measured: 0 without, 0.2 with a middle-layer share of 1/4
