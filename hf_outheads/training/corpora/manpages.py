"""A second real-text corpus built from a package registry: the Linux man-pages project's
manual pages, from Debian's `manpages` and `manpages-dev` packages (system calls, library
functions, file formats, overviews; about 2,500 pages, 5 million characters of English).

The packages are fetched with `apt-get download` (Debian's package archive, no Hub) into a
cache folder, unpacked in Python (a `.deb` is an `ar` archive holding `data.tar.*`) and each
page's roff source is turned into plain text: comments and layout requests dropped, font
requests (`.B`, `.BR`, ...) and escapes (`\\fB`, `\\-`, `\\(em`, ...) resolved to their text.
One record per page, `"<name>(<section>)\\n<text>"`; the split is by a hash of the file name.
Nothing of the packages is executed.
"""

from __future__ import annotations

import gzip
import hashlib
import re
import shlex
from pathlib import Path

from hf_outheads.training.corpora.debian import CACHE_ROOT, deb_members, fetch_packages

PACKAGES = ("manpages", "manpages-dev")
CACHE = CACHE_ROOT / "debian_manpages"
ESCAPES = {r"\-": "-", r"\(em": "\u2014", r"\(en": "\u2013", r"\(aq": "'", r"\(dq": '"', r"\(lq": "\u201c",
           r"\(rq": "\u201d", r"\(bu": "\u2022", r"\(co": "\u00a9", r"\e": "\\", r"\&": "", r"\ ": " ", r"\~": " ",
           r"\|": "", r"\^": "", r"\:": "", r"\%": "", r"\c": "", r"\(ga": "`", r"\(ti": "~", r"\(ha": "^",
           r"\(rs": "\\", r"\*(lq": "\u201c", r"\*(rq": "\u201d"}
FONT_REQUESTS = {".B", ".I", ".BR", ".RB", ".BI", ".IB", ".IR", ".RI", ".SM", ".SB", ".SH", ".SS", ".TP", ".IP", ".UR", ".MT"}
ESCAPE_RE = re.compile("|".join(re.escape(e) for e in sorted(ESCAPES, key=len, reverse=True)))
FONT_RE = re.compile(r"\\f(\[[^\]]*\]|\(..|.)|\\s[-+]?\d+|\\[*n]\(..|\\[*n].|\\\(..")


BREAKS = {".PP", ".LP", ".P", ".TP", ".IP", ".HP", ".br", ".sp", ".RS", ".RE", ".nf", ".fi", ".EX", ".EE", ".SH", ".SS"}


def roff_to_text(source: str) -> str:
    """Plain text of a man page's roff source: filled paragraphs, no-fill blocks kept as lines."""
    return "\n".join(roff_paragraphs(source))


def roff_paragraphs(source: str) -> list[str]:
    """The paragraphs of a man page's roff source in order: headings (`.SH`, `.SS`), filled
    paragraphs (one line each) and no-fill blocks (their lines joined by newlines)."""
    paragraphs, words, fill = [], [], True

    def flush():
        if words:
            paragraphs.append((" " if fill else "\n").join(words))
            words.clear()

    for line in source.splitlines():
        if line.startswith(('.\\"', "'\\\"", '\\"')):
            continue
        if line.startswith((".", "'")):
            request, _, rest = line.partition(" ")
            if request in BREAKS:
                flush()
                fill = {".nf": False, ".EX": False, ".fi": True, ".EE": True}.get(request, fill)
            if request not in FONT_REQUESTS:
                continue
            try:
                parts = shlex.split(rest.replace("\\", "\\\\"), posix=True)
            except ValueError:
                parts = rest.split()
            alternating = len(request) == 3 and request not in (".SH", ".SS", ".TP", ".IP", ".UR", ".MT")
            line = ("" if alternating else " ").join(parts)
            if request in (".SH", ".SS"):
                paragraphs.append(line.capitalize() if line.isupper() else line)
                continue
        line = FONT_RE.sub("", ESCAPE_RE.sub(lambda m: ESCAPES[m.group(0)], line)).rstrip()
        if not line.strip():
            flush()
        else:
            words.append(line if not fill else line.strip())
    flush()
    return [p for p in paragraphs if p.strip()]


def manpage_records(debs: list[Path]) -> list[dict]:
    records = []
    for deb in debs:
        for path, data in deb_members(deb.read_bytes()):
            match = re.search(r"/man/man(\d)/([^/]+)\.\d\w*\.gz$", path)
            if not match:
                continue
            source = gzip.decompress(data).decode("utf-8", errors="replace")
            if re.match(r"\.so\s", source.lstrip()):  # a link to another page
                continue
            text = roff_to_text(source)
            if len(text) > 200:
                records.append({"name": f"{match.group(2)}({match.group(1)})", "text": f"{match.group(2)}({match.group(1)})\n{text}"})
    return sorted(records, key=lambda r: r["name"])


SENTENCE_RE = re.compile(r"(?<=[.!?])\s+(?=[A-Z])")


def restore_pairs(text: str, min_words: int = 6, max_words: int = 30) -> list[dict]:
    """Case and punctuation restoration: `source` is a prose sentence lowercased with its
    punctuation removed, `target` the sentence as written."""
    pairs = []
    for line in text.split("\n")[1:]:
        for sentence in SENTENCE_RE.split(line.strip()):
            words = sentence.split()
            if min_words <= len(words) <= max_words and sentence[-1:] in ".!?" and sentence[:1].isupper():
                source = " ".join(re.sub(r"[^\w\s]", " ", sentence.lower()).split())
                pairs.append({"source": source, "target": sentence})
    return pairs


def load_manpages_dataset(config: str = "text", validation_percent: int = 5, cache: Path = CACHE):
    """`DatasetDict(train, validation)` split by a hash of the page name: `config="text"`, one
    `{"text"}` record per page (language modelling); `"restore"`, `{"source", "target"}`
    sentence pairs of `restore_pairs` (sequence to sequence)."""
    from datasets import Dataset, DatasetDict

    if config not in ("text", "restore"):
        raise ValueError(f"dataset_config {config!r} of debian_manpages is not one of ['text', 'restore'].")
    records = manpage_records(sorted(fetch_packages(cache, PACKAGES).values()))
    held = [int(hashlib.sha1(r["name"].encode()).hexdigest(), 16) % 100 < validation_percent for r in records]
    rows = {"train": [], "validation": []}
    for record, is_held in zip(records, held):
        split = rows["validation" if is_held else "train"]
        split.extend([{"text": record["text"]}] if config == "text" else restore_pairs(record["text"]))
    return DatasetDict({name: Dataset.from_list(split) for name, split in rows.items()})
