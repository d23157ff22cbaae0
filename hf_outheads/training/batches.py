"""The batches of a run: built and checked on the host, where the model's forward no longer checks.

A batch's examples are checked as it is collated (`CheckedCollator`, in the DataLoader's worker
processes when the run has some): a token id outside the model's vocabulary, a label that is neither
-100 nor a token id, or an example longer than the run's lengths (`lengths`) is one line naming the
example (its index in its split: `NumberedExamples`), never a device-side assert in the step.
"""

from __future__ import annotations

import numpy as np
import torch.utils.data
from transformers import DataCollatorForSeq2Seq

from hf_outheads import IGNORE_INDEX

from hf_outheads.training.data import TOKEN_IDS


def lengths(options) -> dict[str, tuple[str, int]]:
    """The most tokens an example may hold in each column, and the option that says so."""
    data = options.data
    if options.model.task == "causal_lm":
        return {TOKEN_IDS: ("block_size", data.block_size), "labels": ("block_size", data.block_size)}
    return {TOKEN_IDS: ("max_source_length", data.max_source_length), "labels": ("max_target_length", data.max_target_length)}


EXAMPLE = "example_index"  # an example's index in its split, carried to the collator (`NumberedExamples`)


class NumberedExamples(torch.utils.data.Dataset):
    """A map-style dataset whose examples carry their index (`EXAMPLE`), so that the collator names a
    bad one; batches are still read many examples at once (`__getitems__`, which a DataLoader uses)."""

    def __init__(self, dataset):
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> dict:
        return {**self.dataset[index], EXAMPLE: index}

    def __getitems__(self, indices: list[int]) -> list[dict]:
        return [{**example, EXAMPLE: index} for index, example in zip(indices, self.dataset.__getitems__(indices))]


class BatchError(ValueError):
    """An example that cannot be trained on or evaluated (a token id outside the model's vocabulary,
    a label that is neither -100 nor one, more tokens than the run's lengths), found on the host as its
    batch is built (`CheckedCollator`), named in one line. A DataLoader worker's error reaches the main
    process re-raised with the worker's traceback as its message: cut back here to that one line."""

    def __init__(self, message: str):
        super().__init__(message.strip().splitlines()[-1].split(f"{type(self).__name__}: ", 1)[-1])


class CheckedCollator:
    """Batches of a split: each example checked on the host (where the batch is built: in the
    DataLoader's worker processes when there are some), then padded by transformers'
    `DataCollatorForSeq2Seq` (labels with -100). The checks are what the model's forward no longer
    does, since they read the batch back from the device at every step: every id in `[0, input_vocab)`,
    every label -100 or in `[0, label_vocab)`, no example longer than `lengths[column]`. A bad example
    is a `BatchError` naming it (its index in the split, or its place in a streamed batch), the column,
    the value and its position. A causal LM's example without labels is scored on its ids, and a causal
    LM's batch without padding (packed blocks) has no attention mask: a mask makes transformers check
    on the host, at every forward, whether it holds any padding."""

    def __init__(self, tokenizer, split: str, input_vocab: int, label_vocab: int, lengths: dict[str, tuple[str, int]],
                 causal: bool):
        self.pad = DataCollatorForSeq2Seq(tokenizer, label_pad_token_id=IGNORE_INDEX, pad_to_multiple_of=None)
        self.split, self.lengths, self.causal = split, lengths, causal
        self.vocab = {TOKEN_IDS: input_vocab, "labels": label_vocab}

    def __call__(self, features: list[dict]) -> dict:
        examples = []
        for place, feature in enumerate(features, 1):
            example = dict(feature)
            index = example.pop(EXAMPLE, None)
            if "labels" not in example and self.causal:
                example["labels"] = example[TOKEN_IDS]
            name = (f"Example {index} of the {self.split} set" if index is not None else
                    f"Example {place} of a {self.split} batch (of a streamed split)")
            for column in (TOKEN_IDS, "labels"):
                if column in example:
                    self.check(name, column, np.asarray(example[column]))
            examples.append(example)
        batch = self.pad(examples)
        if self.causal and len({len(example[TOKEN_IDS]) for example in examples}) == 1:
            batch.pop("attention_mask", None)  # no padding
        return batch

    def check(self, name: str, column: str, values: np.ndarray) -> None:
        option, limit = self.lengths[column]
        if len(values) > limit:
            raise BatchError(f"{name} has {len(values)} {column}, more than {option}={limit}: cut the example to "
                             f"{limit}, or raise {option} (within the model's positions).")
        vocab = self.vocab[column]
        bad = (values < 0) | (values >= vocab)
        if column == "labels":
            bad &= values != IGNORE_INDEX
        if bad.any():
            position = int(bad.argmax())
            what = "label" if column == "labels" else "token id"
            allowed = "-100 (not scored) or a token id" if column == "labels" else "a token id"
            raise BatchError(f"{name} holds the {what} {values[position]} in {column} (position {position}); the model "
                             f"takes {allowed} from 0 to {vocab - 1}. Tokenise the data with the model's tokenizer "
                             "(option tokenizer), or give the model as many embeddings.")
