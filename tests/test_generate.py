"""`generate()` of a converted model emits token-for-token what the original emits."""

import pytest
import torch

from hf_outheads import OutHeadsForCausalLM, OutHeadsForSeq2SeqLM
from hf_outheads.compat import CACHE  # the outputs' cache field: `cache` from transformers 5.24, `past_key_values` before
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


def uncommon_cache_original(family):
    """A tiny original whose cache is not transformers' `cache`: RWKV's recurrent `state`, OpenAI GPT's none."""
    from transformers import OpenAIGPTConfig, OpenAIGPTLMHeadModel, RwkvConfig, RwkvForCausalLM

    torch.manual_seed(0)
    if family == "rwkv":
        config = RwkvConfig(vocab_size=VOCAB, hidden_size=32, attention_hidden_size=32, intermediate_size=64,
                            num_hidden_layers=2, context_length=64, bos_token_id=1, eos_token_id=2)
        return RwkvForCausalLM(config).eval()
    config = OpenAIGPTConfig(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=2, n_positions=64)
    return OpenAIGPTLMHeadModel(config).eval()


@pytest.mark.parametrize("family", ["rwkv", "openai-gpt"])
def test_a_family_with_its_own_cache_or_none_generates_as_the_original(family):
    """RWKV keeps its recurrent state under its own name (`state`): the converted model returns it as `cache` and
    takes it back; OpenAI GPT has no cache: each step reads the whole sequence. Either way cached greedy generation
    scores every step as the original's forward over the whole sequence does (one sequence: transformers' RWKV
    steps a batch of several wrongly with its own state)."""
    original = uncommon_cache_original(family)
    converted = OutHeadsForCausalLM.from_backbone(original).eval()
    ids = prompt(batch_size=1, length=6)
    options = dict(max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0,
                   return_dict_in_generate=True, output_logits=True)
    got, want = converted.generate(ids, **options), original.generate(ids, **options)
    assert torch.equal(got.sequences, want.sequences)
    with torch.no_grad():
        whole = original(got.sequences).logits[:, ids.shape[1] - 1 : -1]  # each new token's scores, no cache
    torch.testing.assert_close(torch.stack(got.logits, dim=1), whole, rtol=1e-4, atol=1e-4)
    if family == "rwkv":  # the state returned as `cache` continues the sequence
        with torch.no_grad():
            first = converted(ids[:, :-1], use_cache=True)
            step = converted(ids[:, -1:], cache=getattr(first, CACHE), use_cache=True).logits
            torch.testing.assert_close(step[:, -1], original(ids).logits[:, -1], rtol=1e-4, atol=1e-4)
