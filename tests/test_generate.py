"""`generate()` of a converted model emits token-for-token what the original emits."""

import pytest
import torch

from hf_outheads import OutHeadsForCausalLM, OutHeadsForSeq2SeqLM
from tiny import ALL, CAUSAL, SEQ2SEQ, VOCAB, tiny_original

DECODING = {
    "greedy": dict(do_sample=False),
    "greedy_no_cache": dict(do_sample=False, use_cache=False),
    "beam": dict(do_sample=False, num_beams=3, num_return_sequences=2),
    "sample": dict(do_sample=True, top_k=10, top_p=0.9, temperature=0.7),
    "sample_no_cache": dict(do_sample=True, top_k=10, top_p=0.9, temperature=0.7, use_cache=False),
}
NEW_TOKENS = 6

_pairs = {}


def original_and_converted(name):
    """(original, converted), built once per backbone."""
    if name not in _pairs:
        original = tiny_original(name)
        wrapper = OutHeadsForSeq2SeqLM if name in SEQ2SEQ else OutHeadsForCausalLM
        _pairs[name] = original, wrapper.from_backbone(original).eval()
    return _pairs[name]


def generate_both(name, inputs, **decoding):
    outputs = []
    for model in original_and_converted(name):
        torch.manual_seed(0)  # same sampling stream for both
        outputs.append(model.generate(**inputs, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, **decoding))
    return outputs


def prompt(batch_size=2, length=5, seed=3):
    return torch.randint(3, VOCAB, (batch_size, length), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("mode", sorted(DECODING))
@pytest.mark.parametrize("name", sorted(ALL))
def test_generate_matches_original(name, mode):
    decoding = DECODING[mode]
    want, got = generate_both(name, {"input_ids": prompt()}, **decoding)
    rows = 2 * decoding.get("num_return_sequences", 1)
    assert want.shape[0] == rows and want.shape[1] >= NEW_TOKENS
    assert torch.equal(got, want)


@pytest.mark.parametrize("mode", ["greedy", "beam", "sample", "greedy_no_cache"])
@pytest.mark.parametrize("name", sorted(CAUSAL))
def test_left_padded_batch_matches_original(name, mode):
    ids = prompt(batch_size=3, length=6, seed=4)
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    mask[1, :1] = 0
    inputs = {"input_ids": ids.masked_fill(mask == 0, 0), "attention_mask": mask, "pad_token_id": 0}
    want, got = generate_both(name, inputs, **DECODING[mode])
    assert torch.equal(got, want)


@pytest.mark.parametrize("name", sorted(CAUSAL))
def test_left_padding_does_not_change_a_row(name):
    """Position ids follow the mask: a left-padded row continues like the same row unpadded."""
    _, model = original_and_converted(name)
    ids = prompt(batch_size=2, length=6, seed=5)
    mask = torch.ones_like(ids)
    mask[0, :2] = 0
    padded = model.generate(input_ids=ids.masked_fill(mask == 0, 0), attention_mask=mask, pad_token_id=0,
                            max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False)
    alone = model.generate(input_ids=ids[:1, 2:], max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                           do_sample=False, pad_token_id=0)
    assert torch.equal(padded[0, -NEW_TOKENS:], alone[0, -NEW_TOKENS:])
