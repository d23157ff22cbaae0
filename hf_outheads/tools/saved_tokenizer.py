"""The tokenizer of a model folder or Hub id, for the commands (`hf-outheads export`, `serve`) and
training alike. A tokenizer loaded here (`load_tokenizer`) forgets how it was loaded: transformers
keeps `from_pretrained`'s `is_local` and `local_files_only` in `init_kwargs`, and `save_pretrained`
would write them into the saved `tokenizer_config.json`, where they would steer every later load."""

from __future__ import annotations

import json
from pathlib import Path

LOAD_TIME_KWARGS = ("is_local", "local_files_only")  # how it was loaded, not what it is


def load_tokenizer(name_or_path: str, auto: bool = True):
    """`AutoTokenizer` (or, `auto=False`, `PreTrainedTokenizerFast`) from a Hub id or folder,
    without the load-time kwargs that `save_pretrained` would otherwise write back."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast  # (when used: importing this module costs no torch)

    tokenizer = (AutoTokenizer if auto else PreTrainedTokenizerFast).from_pretrained(name_or_path)
    for key in LOAD_TIME_KWARGS:
        tokenizer.init_kwargs.pop(key, None)
    return tokenizer


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "vocab.json", "merges.txt", "vocab.txt", "tokenizer.model", "spiece.model")


def load_saved_tokenizer(folder, auto: bool = True):
    """The tokenizer saved in `folder`, None when the folder holds no tokenizer file; a file
    that is there but cannot be read (truncated, empty, not JSON) is a ValueError naming it."""
    folder = Path(folder)
    present = [name for name in TOKENIZER_FILES if (folder / name).is_file()]
    if not present:
        return None
    for name in present:
        if name.endswith(".json"):
            try:
                json.loads((folder / name).read_text(encoding="utf-8"))
            except (UnicodeDecodeError, ValueError) as error:
                raise ValueError(f"The tokenizer file {folder / name} exists but cannot be read ({type(error).__name__}: "
                                 f"{error}): it is damaged. Restore it from where it came from, or train the run anew, "
                                 "which trains a new tokenizer (`hf-outheads train` with --resume never).") from None
    try:
        return load_tokenizer(str(folder), auto)
    except Exception as error:  # noqa: BLE001: any loader failure, said with the folder and its files
        raise ValueError(f"The tokenizer in {folder} ({', '.join(present)}) cannot be loaded: "
                         f"{type(error).__name__}: {error}") from error
