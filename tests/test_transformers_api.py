"""Calling conventions of transformers' models that the wrapper follows: `return_dict=False`,
`output_hidden_states` as a list of layers, `shift_labels`, `output_loading_info`."""

import pytest
import torch
from safetensors.torch import save_file

from hf_outheads import OutHeadsForCausalLM
from head_cases import HEAD_CASES
from tiny import batch, tiny_model


def build(head, backbone="llama"):
    return tiny_model(backbone, head, HEAD_CASES[head])


@pytest.mark.parametrize("backbone", ["llama", "t5"])
def test_return_dict_false_gives_the_output_as_a_tuple(backbone):
    model, data = build("mos", backbone), batch(backbone)
    with torch.no_grad():
        full, plain = model(**data), model(**data, return_dict=False)
    assert isinstance(plain, tuple) and torch.equal(plain[0], full.loss) and torch.equal(plain[1], full.logits)


def test_hidden_states_of_chosen_layers_and_the_head_still_gets_its_own():
    """`doc` reads middle layers (0 and 1 here); the caller asks for layers 2 and -1 only."""
    model, data = build("doc"), batch("llama")
    with torch.no_grad():
        everything = model(data["input_ids"], output_hidden_states=True)
        chosen = model(data["input_ids"], output_hidden_states=[2, -1])
    assert torch.equal(chosen.logits, everything.logits)
    assert chosen.hidden_states[0] is None and chosen.hidden_states[1] is None
    assert torch.equal(chosen.hidden_states[2], everything.hidden_states[2])


def test_shift_labels_are_taken_as_already_shifted():
    model, data = build("tied"), batch("llama")
    shifted = torch.nn.functional.pad(data["labels"][:, 1:], (0, 1), value=-100)
    with torch.no_grad():
        assert torch.equal(model(data["input_ids"], shift_labels=shifted).loss, model(**data).loss)


def test_output_loading_info_reports_missing_keys_instead_of_raising(tmp_path):
    build("linear").save_pretrained(tmp_path)
    save_file({"head.bias": torch.zeros(99)}, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ValueError, match="missing_keys"):
        OutHeadsForCausalLM.from_pretrained(tmp_path)
    model, info = OutHeadsForCausalLM.from_pretrained(tmp_path, output_loading_info=True)
    assert "head.weight" in info["missing_keys"] and "head.bias" not in info["missing_keys"]
