"""Checks shared by the `joint` and `drill` head tests: a model on a tiny backbone must train,
generate, honour `logits_to_keep`, survive save/load, and convert a pretrained LM."""

from __future__ import annotations

import torch

from hf_outheads.tools.conversion import original_lm_head
from hf_outheads.modeling_outheads import shift_right
from tiny import SEQ2SEQ, batch, model_class, tiny_config, tiny_original


def decoder_inputs(name: str) -> dict:
    """Inputs without labels; a seq2seq model gets decoder ids shifted from the labels."""
    inputs = batch(name)
    labels = inputs.pop("labels")
    if name in SEQ2SEQ:
        text = tiny_config(name)
        inputs["decoder_input_ids"] = shift_right(labels, text.decoder_start_token_id, text.pad_token_id)
    return inputs


def check_train_step(model, name: str) -> None:
    """Loss is finite and every head parameter receives a gradient."""
    model.train()
    out = model(**batch(name))
    assert out.logits.shape[-1] == model.config.vocab_size and torch.isfinite(out.loss)
    out.loss.backward()
    for param_name, param in model.head.named_parameters():
        assert param.grad is not None and torch.isfinite(param.grad).all(), param_name
        assert param.grad.abs().sum() > 0, f"no gradient reaches head.{param_name}"
    model.eval()


def check_generate(model, name: str) -> None:
    prompt = batch(name)["input_ids"][:1]
    for beams in (1, 2):
        out = model.generate(prompt, max_new_tokens=3, min_new_tokens=3, num_beams=beams, do_sample=False)
        assert out.shape[0] == 1 and out.shape[1] >= 3


def check_logits_to_keep(model, name: str) -> None:
    inputs = decoder_inputs(name)
    with torch.no_grad():
        full = model(**inputs).logits
        last = model(**inputs, logits_to_keep=1).logits
    assert last.shape[1] == 1 and full.shape[1] > 1
    torch.testing.assert_close(last, full[:, -1:])


def check_save_load(model, name: str, path) -> None:
    model.save_pretrained(path)
    reloaded = model_class(name).from_pretrained(path).eval()
    assert reloaded.config.head_options == model.config.head_options
    inputs = decoder_inputs(name)
    with torch.no_grad():
        assert torch.equal(reloaded(**inputs).logits, model(**inputs).logits)


def convert(name: str, head_type: str, options: dict):
    """(init_from_lm_head's verdict, original logits, converted logits) for `name` converted to the head."""
    original = tiny_original(name)
    converted = model_class(name).from_backbone(original, head_type=head_type, head_options=options).eval()
    exact = converted.head.init_from_lm_head(*original_lm_head(original), converted.output_embedding_matrix())
    inputs = decoder_inputs(name)
    with torch.no_grad():
        return exact, original(**inputs).logits, converted(**inputs).logits


def max_log_prob_error(want: torch.Tensor, got: torch.Tensor) -> float:
    return (got.log_softmax(-1) - want.log_softmax(-1)).abs().max().item()


def mean_kl(want: torch.Tensor, got: torch.Tensor) -> float:
    """KL(original || converted), mean over positions."""
    p = want.log_softmax(-1)
    return (p.exp() * (p - got.log_softmax(-1))).sum(-1).mean().item()
