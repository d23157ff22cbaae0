"""`torch.export` with dynamic batch and sequence sizes, every head: the exported program runs
at other sizes than the traced one and computes what the eager model computes. (The mixtures'
row chunking is a Python loop in eager mode; traced, it is one call: `losses.over_row_chunks`.)"""

import pytest
import torch
from torch.export import Dim, export

from head_cases import HEAD_CASES
from tiny import VOCAB, tiny_model


class CausalLogits(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids):
        return self.model(input_ids=input_ids, use_cache=False).logits


class Seq2SeqLogits(CausalLogits):
    def forward(self, input_ids, decoder_input_ids):
        return self.model(input_ids=input_ids, decoder_input_ids=decoder_input_ids, use_cache=False).logits


def ids(*shape, seed=0):
    return torch.randint(3, VOCAB, shape, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("head", sorted(HEAD_CASES))
def test_causal_export_with_dynamic_batch_and_length(head):
    module = CausalLogits(tiny_model("llama", head, HEAD_CASES[head]))
    dims = {"input_ids": {0: Dim("batch", min=1, max=32), 1: Dim("length", min=2, max=48)}}
    with torch.no_grad():
        program = export(module, (ids(2, 5),), dynamic_shapes=dims, strict=False).module()
        for shape in ((1, 9), (3, 16)):
            inputs = ids(*shape, seed=sum(shape))
            torch.testing.assert_close(program(inputs), module(inputs), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("head", ["tied", "mos"])
def test_seq2seq_export_with_dynamic_sizes(head):
    module = Seq2SeqLogits(tiny_model("t5", head, HEAD_CASES[head]))
    batch = Dim("batch", min=1, max=32)
    dims = {"input_ids": {0: batch, 1: Dim("source", min=2, max=48)},
            "decoder_input_ids": {0: batch, 1: Dim("target", min=2, max=48)}}
    with torch.no_grad():
        program = export(module, (ids(2, 5), ids(2, 4, seed=1)), dynamic_shapes=dims, strict=False).module()
        inputs = (ids(3, 11, seed=2), ids(3, 6, seed=3))
        torch.testing.assert_close(program(*inputs), module(*inputs), rtol=1e-5, atol=1e-5)
