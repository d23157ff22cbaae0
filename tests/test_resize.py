"""`resize_token_embeddings` resizes the head's per-word parameters with the embeddings."""

import pytest
import torch

from head_cases import HEAD_CASES
from tiny import VOCAB, batch, tiny_model

BACKBONES = ("llama", "bart")  # bart: encoder and decoder share one embedding matrix
CASES = [(head, backbone) for head in sorted(HEAD_CASES) for backbone in BACKBONES]
NEW_VOCAB = 110


def per_word_tensors(model):
    return {name: t.detach().clone() for name, t in model.head.state_dict().items() if t.dim() and t.shape[0] == VOCAB}


@pytest.mark.parametrize("head,backbone", CASES, ids=[f"{h}-{b}" for h, b in CASES])
def test_resize_grows_head_and_keeps_old_rows(head, backbone, tmp_path):
    model = tiny_model(backbone, head, HEAD_CASES[head])
    data = batch(backbone)
    before_rows = per_word_tensors(model)
    with torch.no_grad():
        before = model(**data).logits
    model.resize_token_embeddings(NEW_VOCAB)
    assert model.config.vocab_size == model.config.text_config.vocab_size == NEW_VOCAB
    assert model.output_embedding_matrix().shape[0] == NEW_VOCAB
    after_state = model.head.state_dict()
    for name, old in before_rows.items():
        assert after_state[name].shape[0] == NEW_VOCAB, name
        assert torch.equal(after_state[name][:VOCAB], old), name
    with torch.no_grad():
        after = model(**data).logits
    assert after.shape[-1] == NEW_VOCAB
    if not model.head.returns_log_probs:  # scores of the old words do not depend on the new ones
        torch.testing.assert_close(after[..., :VOCAB], before, rtol=1e-5, atol=1e-5)
    model.save_pretrained(tmp_path)
    reloaded = type(model).from_pretrained(tmp_path).eval()
    with torch.no_grad():
        assert torch.equal(reloaded(**data).logits, after)


def test_resize_trains_and_generates_new_words():
    model = tiny_model("llama", "linear", HEAD_CASES["linear"])
    model.resize_token_embeddings(NEW_VOCAB)
    ids = torch.tensor([[5, 105, 6, 107]])  # new words in input and labels
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    assert model.head.weight.grad[105].abs().sum() > 0 and model.head.bias.grad[107] != 0
    assert model.generate(ids, max_new_tokens=2, do_sample=False).shape == (1, 6)


def test_resize_shrinks_and_pads_to_multiple():
    model = tiny_model("llama", "linear", HEAD_CASES["linear"])
    weight = model.head.weight.detach().clone()
    model.resize_token_embeddings(90)
    assert model.head.weight.shape[0] == model.config.vocab_size == 90
    assert torch.equal(model.head.weight, weight[:90])
    model.resize_token_embeddings(None, pad_to_multiple_of=64)
    assert model.head.bias.shape[0] == model.config.text_config.vocab_size == 128
