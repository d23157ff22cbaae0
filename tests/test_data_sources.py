"""Training data from local parquet files, and the built-in corpora streamed."""

from __future__ import annotations

import pytest
from datasets import Dataset, DatasetDict, IterableDataset

from hf_outheads.training import data as data_lib
from hf_outheads.training.options import RunOptions
from hf_outheads.training.tokenization import train_tokenizer

TEXTS = [f"line {i} of the corpus with words {i % 7} and {i % 5}" for i in range(60)]


def test_parquet_data_files_are_read(tmp_path):
    Dataset.from_dict({"text": TEXTS[:40]}).to_parquet(str(tmp_path / "train.parquet"))
    Dataset.from_dict({"text": TEXTS[40:]}).to_parquet(str(tmp_path / "validation.parquet"))
    files = {"train": str(tmp_path / "train.parquet"), "validation": str(tmp_path / "validation.parquet")}
    raw = data_lib.load_raw(RunOptions.from_flat(dict(data_files=files)))
    assert raw["train"]["text"] == TEXTS[:40] and raw["validation"]["text"] == TEXTS[40:]
    streamed = data_lib.load_raw(RunOptions.from_flat(dict(data_files=files, streaming=True, max_steps=2)))
    assert [row["text"] for row in streamed["train"]] == TEXTS[:40]
    tokenizer = train_tokenizer(TEXTS, "wordlevel", 64)
    train, validation = data_lib.select_splits(raw, RunOptions.from_flat(dict(data_files=files)))
    blocks = data_lib.causal_lm_dataset(train, tokenizer, RunOptions.from_flat(dict(block_size=8)))
    assert len(blocks) > 0 and all(len(ids) == 8 for ids in blocks["input_ids"])


def test_mixed_or_unknown_formats_are_refused(tmp_path):
    with pytest.raises(ValueError, match="parquet"):
        data_lib.load_raw(RunOptions.from_flat(dict(data_files={"train": str(tmp_path / "a.parquet"),
                                                                "validation": str(tmp_path / "b.csv")})))


@pytest.mark.parametrize("name", [data_lib.BUILTIN, data_lib.MANPAGES])
def test_builtin_corpora_stream(name, monkeypatch):
    """`streaming: true` with a built-in corpus: every split becomes an IterableDataset."""
    corpus = DatasetDict({"train": Dataset.from_dict({"text": TEXTS[:40]}),
                          "validation": Dataset.from_dict({"text": TEXTS[40:]})})
    _, seq2seq_config = data_lib.BUILT_CORPORA[name]  # the real corpus takes a while to build
    monkeypatch.setitem(data_lib.BUILT_CORPORA, name, (lambda *args, **kwargs: corpus, seq2seq_config))
    options = RunOptions.from_flat(dict(dataset_name=name, streaming=True, max_steps=2))
    raw = data_lib.load_raw(options)
    assert set(raw) == {"train", "validation"} and all(isinstance(split, IterableDataset) for split in raw.values())
    train, validation = data_lib.select_splits(raw, options)
    assert sorted(row["text"] for row in train) == sorted(TEXTS[:40])
    assert [row["text"] for row in validation] == TEXTS[40:]
