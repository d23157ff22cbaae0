"""Forward arguments and runtime features pass through the wrapper: logits_to_keep,
output_hidden_states, inputs_embeds, cache (past key values), SDPA/eager, bf16, activation checkpointing."""

import pytest
import torch

from hf_outheads import OutHeadsForCausalLM, OutHeadsForSeq2SeqLM
from hf_outheads.compat import CACHE, CHECKPOINTING  # the outputs' cache field: `cache` from transformers 5.24, `past_key_values` before
from tiny import SEQ2SEQ, batch, tiny_model

ATOL = dict(rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module")
def llama():
    return tiny_model("llama", "linear")


@pytest.fixture(scope="module")
def ids():
    return batch("llama")["input_ids"]


def logits(model, **inputs):
    with torch.no_grad():
        return model(**inputs).logits


@pytest.mark.parametrize("backbone", ["llama", "t5"])
def test_logits_to_keep_int_and_tensor(backbone):
    model = tiny_model(backbone, "linear")
    inputs = batch(backbone)
    full = logits(model, **inputs)
    last = logits(model, **inputs, logits_to_keep=1)
    assert last.shape[1] == 1
    torch.testing.assert_close(last, full[:, -1:], **ATOL)
    keep = torch.tensor([0, 3])
    torch.testing.assert_close(logits(model, **inputs, logits_to_keep=keep), full[:, keep], **ATOL)
    with torch.no_grad():  # the loss is computed on the kept positions only
        kept_loss = model(**inputs, logits_to_keep=2).loss
    assert not torch.allclose(kept_loss, model(**inputs).loss)


def test_generate_scores_only_the_last_position(llama, ids):
    widths = []
    hook = llama.head.register_forward_hook(lambda module, args, out: widths.append(args[0].hidden.shape[1]))
    try:
        llama.generate(ids, max_new_tokens=3, min_new_tokens=3, do_sample=False)
    finally:
        hook.remove()
    assert widths == [1, 1, 1]


def test_output_hidden_states_causal(llama, ids):
    with torch.no_grad():
        out = llama(input_ids=ids, output_hidden_states=True)
        plain = llama(input_ids=ids)
    assert plain.hidden_states is None
    assert len(out.hidden_states) == llama.config.text_config.num_hidden_layers + 1
    assert out.hidden_states[0].shape == (*ids.shape, 32)


def test_output_hidden_states_seq2seq():
    model = tiny_model("t5", "linear")
    with torch.no_grad():
        out = model(**batch("t5"), output_hidden_states=True)
    assert len(out.decoder_hidden_states) == len(out.encoder_hidden_states) == 3


@pytest.mark.parametrize("backbone", ["llama", "t5"])
def test_inputs_embeds_match_input_ids(backbone):
    model = tiny_model(backbone, "linear")
    inputs = batch(backbone)
    embeds = model.get_input_embeddings()(inputs.pop("input_ids"))
    torch.testing.assert_close(logits(model, inputs_embeds=embeds, **inputs), logits(model, **batch(backbone)), **ATOL)


def test_cache_causal(llama, ids):
    with torch.no_grad():
        prefix = llama(input_ids=ids[:, :4], use_cache=True)
        rest = llama(input_ids=ids[:, 4:], cache=getattr(prefix, CACHE))
    assert getattr(prefix, CACHE) is not None
    torch.testing.assert_close(rest.logits, logits(llama, input_ids=ids)[:, 4:], **ATOL)


def test_cache_seq2seq():
    model = tiny_model("t5", "linear")
    data = batch("t5")
    decoder = model.prepare_decoder_input_ids_from_labels(data["labels"])
    full = logits(model, input_ids=data["input_ids"], decoder_input_ids=decoder)
    with torch.no_grad():
        prefix = model(input_ids=data["input_ids"], decoder_input_ids=decoder[:, :3], use_cache=True)
        rest = model(encoder_outputs=(prefix.encoder_last_hidden_state,), decoder_input_ids=decoder[:, 3:],
                     cache=getattr(prefix, CACHE))
    torch.testing.assert_close(rest.logits, full[:, 3:], **ATOL)


@pytest.mark.parametrize("backbone", ["llama", "t5"])
def test_attn_implementation_reaches_backbone(backbone, tmp_path):
    tiny_model(backbone, "linear").save_pretrained(tmp_path)
    cls = OutHeadsForSeq2SeqLM if backbone in SEQ2SEQ else OutHeadsForCausalLM
    outputs = {}
    for impl in ("sdpa", "eager"):
        model = cls.from_pretrained(tmp_path, attn_implementation=impl).eval()
        assert model.backbone.config._attn_implementation == impl
        outputs[impl] = logits(model, **batch(backbone))
    torch.testing.assert_close(outputs["sdpa"], outputs["eager"], **ATOL)


@pytest.mark.parametrize("backbone", ["llama", "t5"])
def test_bf16_forward_and_backward(backbone, tmp_path):
    reference = tiny_model(backbone, "linear")
    reference.save_pretrained(tmp_path)
    cls = type(reference)
    model = cls.from_pretrained(tmp_path, dtype=torch.bfloat16)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    out = model(**batch(backbone))
    assert out.logits.dtype == torch.bfloat16 and torch.isfinite(out.loss)
    out.loss.backward()
    with torch.no_grad():
        torch.testing.assert_close(out.loss.float(), reference(**batch(backbone)).loss, rtol=0.05, atol=0.05)


def train_step(model, data):
    torch.manual_seed(1)  # same dropout masks with and without checkpointing
    model.zero_grad()
    loss = model(**data).loss
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("backbone", ["llama", "t5"])
def test_activation_checkpointing(backbone):
    model = tiny_model(backbone, "linear").train()
    data = batch(backbone)
    plain_loss, plain_grads = train_step(model, data)
    enable, disable, flag = CHECKPOINTING  # (their names before transformers 5.24: compat.py)
    assert not getattr(model.backbone, flag)
    getattr(model, enable)()
    assert getattr(model.backbone, flag)
    checkpointed_loss, checkpointed_grads = train_step(model, data)
    torch.testing.assert_close(checkpointed_loss, plain_loss, rtol=0, atol=0)
    assert plain_grads.keys() == checkpointed_grads.keys()
    for name, grad in plain_grads.items():
        torch.testing.assert_close(checkpointed_grads[name], grad, **ATOL, msg=name)
    getattr(model, disable)()
    assert not getattr(model.backbone, flag)
