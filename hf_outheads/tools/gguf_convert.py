"""Convert a plain export (`export_plain`) to GGUF with llama.cpp's own `convert_hf_to_gguf.py`.

    hf-outheads gguf LLAMA_CPP_DIR PLAIN_DIR [convert_hf_to_gguf.py options]

LLAMA_CPP_DIR is a llama.cpp source tree (a checkout, or `vendor/llama.cpp` of llama-cpp-python's
source distribution); the options after PLAIN_DIR go to the converter as they are (`--outtype f32
--outfile model.gguf`). The converter runs unchanged, with one answer added: it names a byte-level
BPE tokenizer's pre-tokenizer only by a hash of known tokenizers' output and refuses any other
("BPE pre-tokenizer was not recognized"). A tokenizer trained here (`hf_outheads/training/tokenization.py`,
`tokenizer: bpe`) is GPT-2's byte-level BPE with merges of its own, which no hash names; where the
converter recognises none and the tokenizer splits text as GPT-2's does (a `ByteLevel`
pre-tokenizer with GPT-2's pattern, no prefix space, no normaliser), its pre-tokenizer is named
`gpt-2`, which llama.cpp implements. Any other unrecognised tokenizer is refused as before.
Usage errors (no such tree, no tokenizer in the export) exit with status 2 and one line.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
from pathlib import Path

from hf_outheads.tools.command_line import refuse

USAGE = "usage: hf-outheads gguf LLAMA_CPP_DIR PLAIN_DIR [convert_hf_to_gguf.py options]"


def splits_as_gpt2(folder: Path) -> bool:
    """Whether the folder's tokenizer.json is a BPE whose text is split as GPT-2's tokenizer splits it."""
    spec = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
    pre = spec.get("pre_tokenizer") or {}
    return (spec["model"]["type"] == "BPE" and spec.get("normalizer") is None and pre.get("type") == "ByteLevel"
            and pre.get("use_regex", True) and not pre.get("add_prefix_space", False))


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] in (["-h"], ["--help"]):
        print(f"{USAGE}\n\n{__doc__}")
        return
    if len(args) < 2 or args[0].startswith("-"):
        raise refuse(USAGE)
    llama_cpp, plain = Path(args[0]), Path(args[1])
    script = llama_cpp / "convert_hf_to_gguf.py"
    if not (script.is_file() and (llama_cpp / "conversion" / "base.py").is_file()):
        raise refuse(f"hf-outheads gguf: {llama_cpp} has no convert_hf_to_gguf.py with its conversion/ package: give a "
                 "llama.cpp source tree (a checkout, or vendor/llama.cpp of llama-cpp-python's sdist)")
    if not (plain / "tokenizer.json").is_file():
        raise refuse(f"hf-outheads gguf: {plain} has no tokenizer.json: export with the tokenizer "
                 "(`model.export_plain(path, tokenizer)`, `hf-outheads export` writes the run's)")
    sys.path.insert(0, str(llama_cpp))
    if "NO_LOCAL_GGUF" not in os.environ:  # the tree's own gguf package, as the script imports it
        sys.path.insert(1, str(llama_cpp / "gguf-py"))
    from conversion.base import TextModel, logger

    recognise = TextModel.get_vocab_base_pre

    def get_vocab_base_pre(self, tokenizer) -> str:
        try:
            return recognise(self, tokenizer)
        except NotImplementedError:
            if not splits_as_gpt2(Path(self.dir_model)):
                raise
            logger.info("hf-outheads gguf: a byte-level BPE split as GPT-2's: pre-tokenizer 'gpt-2'")
            return "gpt-2"

    TextModel.get_vocab_base_pre = get_vocab_base_pre
    sys.argv = [str(script), *args[1:]]
    runpy.run_path(str(script), run_name="__main__")


if __name__ == "__main__":
    main()
