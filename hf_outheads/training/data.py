"""Datasets for training: load (Hub, local files, built-in stdlib corpus, streaming),
check columns, records and splits, tokenise with `map(batched=True)`, group causal-LM text into blocks
(the batches are built and checked in `batches.py`).

Pre-tokenised data: a split with an `input_ids` column (TRL's rule for a processed dataset) is used
as it is, one example a row: no tokenisation, no grouping into blocks. Its `labels` column holds the
targets (a seq2seq run needs one; -100 marks a position that is not scored); a causal LM's example
without one is scored on its `input_ids` (the model shifts them). The tokenizer must be the one the
ids were made with (`tokenizer: <folder or Hub id>`). E.g. the scale comparison's packed corpus
(`hf_outheads/training/corpora/debian_docs.py`): one row of 1,024 ids a block, trained with `block_size: 1024`.
"""

from __future__ import annotations

import os
from itertools import chain

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from datasets import Dataset, IterableDataset, IterableDatasetDict, load_dataset

from hf_outheads.training.corpora.manpages import load_manpages_dataset
from hf_outheads.training.corpora.manpages_l10n import load_manpages_l10n_dataset
from hf_outheads.training.corpora.stdlib import load_stdlib_dataset

BUILTIN = "stdlib_docstrings"
MANPAGES = "debian_manpages"  # built from Debian's manpages packages (hf_outheads/training/corpora/manpages.py)
MANPAGES_L10N = "debian_manpages_l10n"  # their translations aligned with them (hf_outheads/training/corpora/manpages_l10n.py)
# corpora built here: name -> (loader of a config, the config of the seq2seq task; "text" is the LM one)
BUILT_CORPORA = {BUILTIN: (load_stdlib_dataset, "summary"), MANPAGES: (load_manpages_dataset, "restore"),
                 MANPAGES_L10N: (load_manpages_l10n_dataset, "fr-en")}
FILE_FORMATS = {".txt": "text", ".text": "text", ".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet"}
TOKEN_IDS = "input_ids"  # a split with this column is pre-tokenised (see the module docstring)


def _file_format(data_files: dict) -> str:
    formats = {FILE_FORMATS.get(os.path.splitext(str(path))[1]) for paths in data_files.values()
               for path in (paths if isinstance(paths, list) else [paths])}
    if None in formats or len(formats) != 1:
        raise ValueError(f"data_files must all be one of {sorted(FILE_FORMATS)} files, got {data_files}.")
    return formats.pop()


def _check_files_not_empty(data_files: dict) -> None:
    for split, paths in data_files.items():
        for path in paths if isinstance(paths, list) else [paths]:
            if os.path.isfile(path) and os.path.getsize(path) == 0:
                raise ValueError(f"The {split!r} split is empty: data_files[{split!r}] = {path!r} has no data.")


def corpus_config(options) -> str:
    """The config of a corpus built here that the run uses: `dataset_config`, by default "text"
    for a causal LM and the corpus's seq2seq task otherwise."""
    data = options.data
    return data.dataset_config or ("text" if options.model.task == "causal_lm" else BUILT_CORPORA[data.dataset_name][1])


def load_raw(options):
    """The dataset splits named by the options, before tokenisation."""
    data = options.data
    if data.dataset_name in BUILT_CORPORA:
        raw = BUILT_CORPORA[data.dataset_name][0](corpus_config(options))
        return _to_iterable(raw) if data.streaming else raw
    if data.data_files:
        _check_files_not_empty(data.data_files)
        arguments, what = (_file_format(data.data_files),), f"data_files {data.data_files}"
        keywords = {"data_files": data.data_files}
    elif data.dataset_name:
        arguments, what, keywords = (data.dataset_name, data.dataset_config), f"dataset_name {data.dataset_name!r}", {}
    else:
        raise ValueError("Set dataset_name (a Hub dataset or 'stdlib_docstrings') or data_files.")
    try:
        return load_dataset(*arguments, streaming=data.streaming, **keywords)
    except (OSError, ValueError) as error:  # no such file or dataset, no network, ...: said in one line
        reason = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise ValueError(f"The {what} cannot be loaded: {reason}") from error


def _to_iterable(splits):
    return IterableDatasetDict({name: split.to_iterable_dataset() for name, split in splits.items()})


def select_splits(raw, options) -> tuple:
    """(train, validation); hold out validation_percent of train if there is no validation split."""
    data = options.data
    if data.train_split not in raw:
        raise ValueError(f"The dataset has no split '{data.train_split}'; it has {list(raw)}.")
    train = raw[data.train_split]
    require_columns(train, needed_columns(options, train))  # before a tokenizer is trained on them
    train = checked_records(train, options, data.train_split)
    if data.validation_split in raw:
        validation = checked_records(raw[data.validation_split], options, data.validation_split)
    elif isinstance(train, IterableDataset):
        raise ValueError(f"No split '{data.validation_split}' (splits: {list(raw)}); streaming cannot hold one out.")
    else:
        held = train.train_test_split(test_size=data.validation_percent / 100, seed=options.training.seed, shuffle=True)
        train, validation = held["train"], held["test"]
    if isinstance(train, IterableDataset):  # a streamed split can only be shuffled within a buffer
        train = train.shuffle(seed=options.training.seed, buffer_size=10_000)
    train, validation = first(train, data.max_train_samples), first(validation, data.max_eval_samples)
    for name, split in ((data.train_split, train), (data.validation_split, validation)):
        if isinstance(split, Dataset) and len(split) == 0:
            raise ValueError(f"Split '{name}' is empty.")
    return train, validation


def first(split, count: int | None):
    """The first `count` examples of `split` (all: None)."""
    if count is None:
        return split
    return split.take(count) if isinstance(split, IterableDataset) else split.select(range(min(count, len(split))))


def column_names(split) -> list[str]:
    available = split.column_names
    if available is None:  # streaming without features: peek at the first example
        first = next(iter(split), None)
        if first is None:
            raise ValueError("The streamed split is empty.")
        available = list(first)
    return available


def pretokenised(split) -> bool:
    """The split holds token ids (an `input_ids` column), used as they are."""
    return TOKEN_IDS in column_names(split)


def needed_columns(options, split=None) -> list[str]:
    """The columns a run reads from `split`: the pre-tokenised ids (and a seq2seq run's labels), or the text."""
    if split is not None and pretokenised(split):
        return [TOKEN_IDS] + (["labels"] if options.model.task == "seq2seq" else [])
    if options.model.task == "causal_lm":
        return [options.data.text_column]
    return ["translation"] if options.data.source_lang else [options.data.source_column, options.data.target_column]


def require_columns(split, columns: list[str]) -> None:
    available = column_names(split)
    missing = [column for column in columns if column not in available]
    if missing:
        raise ValueError(f"Column(s) {missing} not found; the dataset has {available}. Set text_column / "
                         "source_column / target_column (or source_lang / target_lang for translation data).")


def text_columns(options, split) -> list[str]:
    """The columns whose every record must hold text (a translation pair's languages are not checked; a
    pre-tokenised split's ids are checked as its batches are built: `batches.CheckedCollator`)."""
    if pretokenised(split) or (options.model.task != "causal_lm" and options.data.source_lang):
        return []
    return needed_columns(options)


def record_place(options, split_name: str, index: int) -> str:
    """Where record `index` of a split is, in words: its line when the split is one local text or
    JSON-lines file (a text file's every line is a record, a JSON-lines file's every non-blank line),
    else its number and the split's files."""
    files = options.data.data_files.get(split_name)
    files = [str(path) for path in (files if isinstance(files, list) else [files] if files else [])]
    place = f"record {index + 1} of the {split_name!r} split" + (f" ({', '.join(files)})" if files else "")
    suffix = os.path.splitext(files[0])[1] if len(files) == 1 and os.path.isfile(files[0]) else None
    if suffix not in (".txt", ".text", ".jsonl"):
        return place
    with open(files[0], encoding="utf-8", errors="replace") as handle:
        lines = [number for number, line in enumerate(handle, 1) if suffix != ".jsonl" or line.strip()]
    return f"{files[0]}, line {lines[index]}" if index < len(lines) else place


def not_text(options, split_name: str, column: str, index: int, value) -> ValueError:
    return ValueError(f"{record_place(options, split_name, index)}: field {column!r} is missing or not text "
                      f"({value!r}); every record needs its text there. Fix the record, or name the field that holds "
                      "the text with text_column / source_column / target_column.")


def no_text(options, split_name: str, column: str, records: int) -> ValueError:
    files = options.data.data_files.get(split_name)
    return ValueError(f"The {split_name!r} split holds no text: field {column!r} is empty or blank in each of its "
                      f"{records} records{f' ({files})' if files else ''}. Give data with text.")


def first_text(split, options, split_name: str, columns: list[str]) -> None:
    """Read a stream until each of `columns` has held non-blank text: a ValueError when it ends
    before (`no_text`), or when a record read until then misses a field or holds no string there
    (`not_text`)."""
    blank, records = list(columns), 0
    for records, record in enumerate(split, 1):
        for column in columns:
            if not isinstance(record.get(column), str):
                raise not_text(options, split_name, column, records - 1, record.get(column))
        blank = [column for column in blank if not record[column].strip()]
        if not blank:
            return
    raise no_text(options, split_name, blank[0], records)


def checked_records(split, options, split_name: str):
    """`split`, each record of which holds a string in the run's text columns (`text_columns`), and
    which holds some non-blank text in each: a Dataset is checked now; a stream is read now up to its
    first text (`first_text`), and its records are checked as it is read. A ValueError names the file
    and line (or the record) and the field."""
    columns = text_columns(options, split)
    if isinstance(split, IterableDataset):
        if columns:
            first_text(split, options, split_name, columns)

        def check(batch, indices):
            for column in columns:
                for value, index in zip(batch[column], indices):
                    if not isinstance(value, str):
                        raise not_text(options, split_name, column, index, value)
            return batch

        return split.map(check, batched=True, with_indices=True) if columns else split
    for column in columns:
        values = split.with_format("arrow")[column]
        if not (pa.types.is_string(values.type) or pa.types.is_large_string(values.type) or pa.types.is_null(values.type)):
            raise ValueError(f"Field {column!r} of the {split_name!r} split holds {values.type} values, not text "
                             f"(the first: {values[0].as_py()!r}). Name the field that holds the text with "
                             "text_column / source_column / target_column.")
        missing = pc.index(pc.is_null(values), True).as_py()
        if missing >= 0:
            raise not_text(options, split_name, column, missing, None)
        if len(values) and not pc.max(pc.utf8_length(pc.utf8_trim_whitespace(values))).as_py():  # (none: 'is empty')
            raise no_text(options, split_name, column, len(values))
    return split


def training_texts(split, options):
    """Texts a tokenizer is trained on: the causal-LM text, or both seq2seq sides."""
    for example in split:
        if options.model.task == "causal_lm":
            yield example[options.data.text_column]
        else:
            yield from _source_target(example, options)


def _source_target(example, options) -> tuple[str, str]:
    if options.data.source_lang:
        pair = example["translation"]
        return options.data.source_prefix + pair[options.data.source_lang], pair[options.data.target_lang]
    return options.data.source_prefix + example[options.data.source_column], example[options.data.target_column]


def _with_eos(ids: list[int], eos: int | None) -> list[int]:
    return ids + [eos] if eos is not None and (not ids or ids[-1] != eos) else ids


def _map(split, function, options, remove_columns):
    kwargs = dict(batched=True, remove_columns=remove_columns)
    if isinstance(split, Dataset):
        kwargs.update(num_proc=options.data.preprocessing_num_workers, desc="Tokenising")
    return split.map(function, **kwargs)


def causal_lm_dataset(split, tokenizer, options):
    """Documents tokenised, each ended by eos, concatenated and cut into `block_size` blocks
    (the remainder dropped); labels are the inputs (the model shifts them)."""
    require_columns(split, needed_columns(options))
    block, eos = options.data.block_size, tokenizer.eos_token_id

    def tokenise_and_group(batch):  # whole documents (no length warning: they are cut into blocks here)
        texts = tokenizer(batch[options.data.text_column], add_special_tokens=False, verbose=False)["input_ids"]
        ids = [_with_eos(i, eos) for i in texts]
        stream = list(chain.from_iterable(ids))
        blocks = [stream[i:i + block] for i in range(0, len(stream) - block + 1, block)]
        return {"input_ids": blocks, "labels": [list(b) for b in blocks]}

    return _map(split, tokenise_and_group, options, _columns(split))


def seq2seq_dataset(split, tokenizer, options):
    """Source ids (truncated to max_source_length) and target ids as labels, both ended by eos."""
    require_columns(split, needed_columns(options))
    eos = tokenizer.eos_token_id

    def tokenise(batch):  # whole texts (no length warning: truncated here)
        pairs = [_source_target(dict(zip(batch, values)), options) for values in zip(*batch.values())]
        sources = tokenizer([s for s, _ in pairs], add_special_tokens=False, verbose=False)["input_ids"]
        targets = tokenizer([t for _, t in pairs], add_special_tokens=False, verbose=False)["input_ids"]
        return {"input_ids": [_with_eos(s[: options.data.max_source_length - 1], eos) for s in sources],
                "labels": [_with_eos(t[: options.data.max_target_length - 1], eos) for t in targets]}

    return _map(split, tokenise, options, _columns(split))


def _columns(split):
    if split.column_names is not None:
        return split.column_names
    return list(next(iter(split)))


def as_examples(split, tokenizer, options):
    """`split` as the run's examples: a pre-tokenised split's ids (and labels) as they are, text tokenised."""
    if pretokenised(split):
        require_columns(split, needed_columns(options, split))
        return split.select_columns([name for name in (TOKEN_IDS, "labels") if name in column_names(split)])
    build = causal_lm_dataset if options.model.task == "causal_lm" else seq2seq_dataset
    return build(split, tokenizer, options)


def tokenised_splits(train, validation, tokenizer, options):
    """The run's examples of both splits (`as_examples`); a ValueError when one has none (a stream:
    its first is read now)."""
    train, validation = as_examples(train, tokenizer, options), as_examples(validation, tokenizer, options)
    data = options.data
    for name, split, files in (("training", train, data.data_files.get(data.train_split)),
                               ("validation", validation, data.data_files.get(data.validation_split))):
        if len(split) == 0 if isinstance(split, Dataset) else next(iter(split), None) is None:
            raise ValueError(f"The {name} split{f' ({files})' if files else ''} has no example after tokenisation"
                             + (f" (fewer than block_size={data.block_size} tokens)."
                                if options.model.task == "causal_lm" else "."))
    return train, validation


def word_counts(train, vocab_size: int, limit: int = 100_000):
    """Training-set frequency of every token id among the predicted tokens (labels; a causal LM's
    ids where it has none), from at most `limit` examples; heads that use frequencies (sampling
    proposals, code tables) and the frequency bands read it."""
    column = "labels" if "labels" in column_names(train) else TOKEN_IDS
    counts = np.zeros(vocab_size, dtype=np.int64)
    if isinstance(train, IterableDataset):
        batches = (np.fromiter(chain.from_iterable(batch[column]), dtype=np.int64)
                   for batch in train.take(limit).iter(batch_size=1000))
    else:  # the column's values at once, from arrow (no Python list per example)
        values = train.select(range(min(limit, len(train)))).with_format("arrow")[column]
        batches = [pc.list_flatten(values).to_numpy(zero_copy_only=False).astype(np.int64)]
    for ids in batches:
        counts += np.bincount(ids[(ids >= 0) & (ids < vocab_size)], minlength=vocab_size)
    return counts


def sample_prompt(split, options, tokenizer) -> str:
    """The start (40 characters) of the first example of a causal LM's `split`: its text, or a pre-tokenised
    one's ids decoded; "" for a seq2seq run."""
    if options.model.task != "causal_lm":
        return ""
    example = next(iter(split))
    if TOKEN_IDS in example:
        return tokenizer.decode(example[TOKEN_IDS][:40], skip_special_tokens=True)[:40]
    return example[options.data.text_column][:40]
