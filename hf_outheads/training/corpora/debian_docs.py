"""The scale comparison's corpus (`studies/scale_heads.py`): the English documentation of
Debian packages, from the package archive (no Hub), tokenised with a 32K byte-level BPE and
packed into blocks of token ids on the CPU, compressed so that it travels to a GPU machine.

    python -m hf_outheads.training.corpora.debian_docs data/scale_corpus   # download, extract, BPE 32K, pack

Sources (`PACKAGES`, one extraction rule each; nothing of a package is executed): the
reStructuredText sources (`_sources/*.txt`) of the Python 3.11, Sphinx, Debian Policy, Developer's
Reference, scikit-learn, SymPy, LLVM, Clang, Flask and Hypothesis manuals; git's AsciiDoc pages;
Vim's help files; Perl's POD manual; the HTML manuals of PostgreSQL, Django, bash, Node.js,
Apache httpd (English), SciPy's tutorial and the Rust books (paragraph text); the Debian Reference,
the New Maintainers' Guide and the GNU coding standards as plain text; the Linux man-pages
(`manpages`).
Not used: WordNet and the gettext catalogs (reserved for independent evaluation), and the
Debian Administrator's Handbook (the held-out text of `debian_handbook`).

Each file is one document; a document goes to validation when a hash of its path falls in
the lowest `validation_percent` buckets. Documents are joined with `</s>` and cut into
`block_size`-token blocks (a causal LM's inputs; its labels are the same ids, shifted by the model).
Written to the output folder: `tokenizer.json` (and the transformers files), `train.u16.xz`
and `validation.u16.xz` (little-endian uint16 ids, blocks of `block_size`), `corpus.json`
(sizes, sources, sha256 of the packed files).
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import html.parser
import json
import lzma
import re
from pathlib import Path

import numpy as np

from hf_outheads.training.corpora.debian import CACHE_ROOT, deb_members, fetch_packages
from hf_outheads.training.corpora.manpages import roff_to_text

CACHE = CACHE_ROOT / "debian_docs"
# package -> (regex a member path must match, format)
PACKAGES = {
    "python3.11-doc": (r"/html/_sources/.*\.rst\.txt$", "text"),
    "sphinx-doc": (r"/_sources/.*\.rst\.txt$", "text"),
    "debian-policy": (r"/_sources/.*\.rst\.txt$", "text"),
    "developers-reference": (r"/_sources/.*\.rst\.txt$", "text"),
    "git-doc": (r"/git-doc/.*\.txt$", "text"),
    "perl-doc": (r"/pod/.*\.pod$", "pod"),
    "postgresql-doc-15": (r"/html/.*\.html$", "html"),
    "python-django-doc": (r"/html/(?!_modules/|genindex|py-modindex|search)[^_].*\.html$", "html"),
    "bash-doc": (r"/bashref\.html$", "html"),
    "debian-reference-en": (r"\.en\.txt\.gz$", "text"),
    "maint-guide": (r"\.en\.txt\.gz$", "text"),
    "gnu-standards": (r"standards\.text\.gz$", "text"),
    "python-sklearn-doc": (r"/_sources/.*\.txt$", "text"),
    "python-sympy-doc": (r"/_sources/.*\.txt$", "text"),
    "llvm-15-doc": (r"/_sources/(?!AMDGPU/).*\.txt$", "text"),  # AMDGPU/: instruction tables
    "clang-15-doc": (r"/_sources/.*\.txt$", "text"),
    "python-flask-doc": (r"/_sources/.*\.txt$", "text"),
    "python-hypothesis-doc": (r"/_sources/.*\.txt$", "text"),
    "vim-runtime": (r"/vim\d+/doc/[^/]+\.txt$", "text"),
    "nodejs-doc": (r"/api/(?!all\.html)[^/]+\.html$", "html"),  # all.html repeats every page
    "apache2-doc": (r"/manual/en/.*\.html$", "html"),
    "rust-doc": (r"/html/(book|rust-by-example|reference|nomicon|rustc|embedded-book|edition-guide)/(?!print\.html).*\.html$",
                 "html"),  # the books (print.html repeats each), not the API pages
    "python-scipy-doc": (r"/html/tutorial/.*\.html$", "html"),
    "manpages": (r"/man/man\d/[^/]+\.\d\w*\.gz$", "roff"),
    "manpages-dev": (r"/man/man\d/[^/]+\.\d\w*\.gz$", "roff"),
}
BLOCK_SIZE = 1024
EOS = "</s>"


class HtmlText(html.parser.HTMLParser):
    """The text of an HTML page, one line per block element; scripts, styles, the head and
    navigation bars (DocBook's and Sphinx's) dropped with everything inside them."""

    SKIP = {"script", "style", "nav", "head"}
    SKIP_CLASSES = {"navheader", "navfooter", "sphinxsidebar", "related", "footer"}
    BLOCKS = {"p", "div", "li", "dt", "dd", "pre", "h1", "h2", "h3", "h4", "h5", "h6", "tr", "br", "table", "section"}

    def __init__(self):
        super().__init__()
        self.skip: list = []  # [tag, depth] of the element being dropped
        self.lines, self.parts, self.pre = [], [], 0

    def handle_starttag(self, tag, attrs):
        if self.skip:
            self.skip[1] += tag == self.skip[0]
            return
        classes = set((dict(attrs).get("class") or "").split())
        if tag in self.SKIP or classes & self.SKIP_CLASSES or ("role", "navigation") in attrs:
            self.skip = [tag, 1]
            return
        if tag in self.BLOCKS:
            self.flush()
        self.pre += tag == "pre"

    def handle_endtag(self, tag):
        if self.skip:
            self.skip[1] -= tag == self.skip[0]
            if self.skip[1] == 0:
                self.skip = []
        elif tag in self.BLOCKS:
            self.flush()
            self.pre -= tag == "pre" and self.pre > 0

    def handle_data(self, data):
        if not self.skip:
            self.parts.append(data)

    def flush(self):
        text = "".join(self.parts)
        self.parts = []
        text = text.strip("\n") if self.pre else " ".join(text.split())
        if text.strip():
            self.lines.append(text)


def html_to_text(source: str) -> str:
    parser = HtmlText()
    parser.feed(source)
    parser.close()
    parser.flush()
    return "\n".join(parser.lines)


POD_WIDE_CODES = [re.compile(rf"[BCEFILSXZ]<{{{n}}}\s+(.+?)\s+>{{{n}}}") for n in (4, 3, 2)]  # C<< $x->y >>
POD_CODE = re.compile(r"[BCEFILSXZ]<([^<>]*)>")  # innermost first


def pod_to_text(source: str) -> str:
    """Plain text of Perl POD: headings kept as lines, other commands dropped, formatting codes
    (`B<...>`, `C<<< ... >>>`, `L<text|link>`) resolved to their text."""
    lines = []
    for line in source.splitlines():
        if line.startswith("="):
            command, _, rest = line.partition(" ")
            if command.startswith(("=head", "=item")) and rest.strip():
                line = rest
            else:
                continue
        for pattern in POD_WIDE_CODES:
            line = pattern.sub(lambda m: m.group(1), line)
        for _ in range(3):  # nested codes
            line = POD_CODE.sub(lambda m: m.group(1).split("|")[0], line)
        lines.append(line)
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()


def member_text(data: bytes, path: str, kind: str) -> str:
    if path.endswith(".gz"):
        data = gzip.decompress(data)
    source = data.decode("utf-8", errors="replace")
    if kind == "html":
        return html_to_text(source)
    if kind == "pod":
        return pod_to_text(source)
    if kind == "roff":
        return "" if re.match(r"\.so\s", source.lstrip()) else roff_to_text(source)
    return source.strip()


def package_documents(packages=tuple(PACKAGES), cache: Path = CACHE):
    """Yield (name, text) of every document of `packages` (keys of PACKAGES), at least 200 characters."""
    for name, deb in fetch_packages(cache, tuple(packages)).items():
        pattern, kind = PACKAGES[name]
        for path, data in sorted(deb_members(deb.read_bytes())):
            if re.search(pattern, path):
                text = member_text(data, path, kind)
                if len(text) >= 200:
                    yield f"{name}:{path.lstrip('./')}", text


def stdlib_documents():
    """Yield (name, text) of the Python standard library's docstrings (`stdlib`)."""
    from hf_outheads.training.corpora.stdlib import build_records_isolated

    records = build_records_isolated("text", validation_percent=0)["train"]
    for record in records:
        yield "stdlib:" + record["text"].split("\n", 1)[0], record["text"]


def is_validation(name: str, validation_percent: float) -> bool:
    return int(hashlib.sha1(name.encode()).hexdigest(), 16) % 10000 < validation_percent * 100


def pack(documents, out: Path, vocab_size: int = 32000, block_size: int = BLOCK_SIZE,
         validation_percent: float = 2.0, min_frequency: int = 2) -> dict:
    """Train the BPE on the training documents, tokenise every document, join them with `</s>`
    and cut each split into `block_size`-token blocks (the tail shorter than a block is
    dropped); write the tokenizer, the packed splits and `corpus.json` into `out`."""
    from hf_outheads.training.tokenization import train_tokenizer

    splits = {"train": [], "validation": []}
    sources: dict[str, int] = {}
    for name, text in documents:
        splits["validation" if is_validation(name, validation_percent) else "train"].append(text)
        package = name.split(":")[0]
        sources[package] = sources.get(package, 0) + len(text)
    if not splits["train"] or not splits["validation"]:
        raise ValueError(f"The corpus needs documents in both splits: {len(splits['train'])} training and "
                         f"{len(splits['validation'])} validation documents; give more documents or change "
                         "validation_percent.")
    tokenizer = train_tokenizer(splits["train"], "bpe", vocab_size, min_frequency)
    if len(tokenizer) > 65536:
        raise ValueError(f"A vocabulary of {len(tokenizer)} does not fit uint16 ids.")
    out.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(out)
    eos = tokenizer.convert_tokens_to_ids(EOS)
    info = {"vocab_size": len(tokenizer), "block_size": block_size, "validation_percent": validation_percent,
            "source_characters": sources, "splits": {}}
    backend = tokenizer.backend_tokenizer
    for split, texts in splits.items():
        ids = []
        for start in range(0, len(texts), 256):
            for encoding in backend.encode_batch(texts[start:start + 256], add_special_tokens=False):
                ids.extend(encoding.ids)
                ids.append(eos)
        blocks = len(ids) // block_size
        if blocks == 0:
            raise ValueError(f"The {split} split has {len(ids)} tokens, less than one block of {block_size}.")
        array = np.asarray(ids[: blocks * block_size], dtype="<u2").reshape(blocks, block_size)
        data = lzma.compress(array.tobytes(), preset=9 | lzma.PRESET_EXTREME)
        (out / f"{split}.u16.xz").write_bytes(data)
        info["splits"][split] = {"documents": len(texts), "characters": sum(map(len, texts)), "tokens": len(ids),
                                 "blocks": blocks, "compressed_bytes": len(data),
                                 "sha256": hashlib.sha256(data).hexdigest()}
    (out / "corpus.json").write_text(json.dumps(info, indent=1) + "\n")
    return info


def load_blocks(folder: Path, split: str) -> np.ndarray:
    """The `(blocks, block_size)` uint16 array of a packed split, checked against `corpus.json`."""
    info = json.loads((folder / "corpus.json").read_text())
    data = (folder / f"{split}.u16.xz").read_bytes()
    if hashlib.sha256(data).hexdigest() != info["splits"][split]["sha256"]:
        raise ValueError(f"{folder / f'{split}.u16.xz'} does not match corpus.json's checksum: pack the corpus again.")
    return np.frombuffer(lzma.decompress(data), dtype="<u2").reshape(-1, info["block_size"])


def write_dataset(folder: Path, out: Path) -> dict[str, str]:
    """The packed splits as a pre-tokenised dataset that `hf_outheads/training/train.py` trains on as it is (its
    `data_files`; `hf_outheads/training/data.py`): a parquet file per split in `out`, one row of `input_ids` a
    block. Returns the `data_files` mapping."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    out.mkdir(parents=True, exist_ok=True)
    files = {}
    for split in ("train", "validation"):
        blocks = load_blocks(folder, split)
        offsets = pa.array(np.arange(0, blocks.size + 1, blocks.shape[1], dtype=np.int32))
        files[split] = str(out / f"{split}.parquet")
        pq.write_table(pa.table({"input_ids": pa.ListArray.from_arrays(offsets, pa.array(blocks.ravel()))}), files[split])
    return files


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path, help="folder to write the tokenizer and the packed splits into")
    parser.add_argument("--packages", default=",".join(PACKAGES), help="comma-separated keys of PACKAGES")
    parser.add_argument("--vocab_size", type=int, default=32000)
    parser.add_argument("--block_size", type=int, default=BLOCK_SIZE)
    parser.add_argument("--validation_percent", type=float, default=2.0)
    parser.add_argument("--cache", type=Path, default=CACHE, help="where the .deb files are downloaded")
    parser.add_argument("--stdlib", action="store_true",
                        help="instead of the packages: the Python standard library's docstrings (on every machine; "
                             "the small corpus of `maintainer/gpu_run.sh --tiny`)")
    args = parser.parse_args(argv)
    if args.stdlib:
        info = pack(stdlib_documents(), args.out, args.vocab_size, args.block_size, args.validation_percent)
        return print(json.dumps(info, indent=1))
    packages = [p for p in args.packages.split(",") if p]
    unknown = sorted(set(packages) - set(PACKAGES))
    if unknown:
        raise SystemExit(f"Unknown package(s) {unknown}: use keys of PACKAGES {sorted(PACKAGES)}.")
    info = pack(package_documents(packages, args.cache), args.out, args.vocab_size, args.block_size,
                args.validation_percent)
    print(json.dumps(info, indent=1))


if __name__ == "__main__":
    main()
