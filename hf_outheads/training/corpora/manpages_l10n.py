"""A real parallel corpus from a package registry: the Linux man-pages translated by the
manpages-l10n project (Debian's `manpages-<lang>` and `manpages-<lang>-dev` packages) aligned
with their English originals (`manpages`, `manpages-dev`), for translation into English.

manpages-l10n builds each translated page with po4a from the English page of the same
upstream version: po4a translates paragraph by paragraph and keeps the roff structure, so the
two pages have the same layout requests in the same order. A page pair is used only if it
does align: after the sections the translators append (translator credits, after the last
English section) are cut, the sequence of break requests (`.SH`, `.SS`, `.PP`, `.TP`, `.IP`,
`.nf`, ...) must be identical and both pages must have the same number of paragraphs
(`manpages.roff_paragraphs`); otherwise the whole page is discarded. Aligned
paragraphs become pairs, split further into sentences where both sides have the same number
of sentences. Dropped: headings and no-fill blocks (code, synopses), paragraphs left in
English (po4a keeps the original where a translation is missing or outdated), and pairs whose
lengths disagree (character ratio outside `MAX_RATIO`).

Only pages of the Linux man-pages project are used (the English of both packages); the
translations of other packages' pages in manpages-l10n, and the localized pages that
installed packages ship themselves, are not. Configs: `<lang>-en` for one language
(`LANGUAGES`), `x-en` for all of them; records `{"source", "target", "lang", "page"}`, split
by a hash of the page name, so every pair of a page is in one split. Nothing of the packages
is executed.
"""

from __future__ import annotations

import gzip
import hashlib
import random
import re
from pathlib import Path

from hf_outheads.training.corpora.debian import CACHE_ROOT, deb_members, fetch_packages
from hf_outheads.training.corpora.manpages import BREAKS, PACKAGES as ENGLISH_PACKAGES, SENTENCE_RE, roff_paragraphs

LANGUAGES = ("de", "fr", "es", "pl", "it", "nl")  # manpages-l10n languages in Latin script with Debian packages
CACHE = CACHE_ROOT / "debian_manpages_l10n"
MAX_RATIO = 2.0  # longest / shortest side, in characters
MIN_WORDS, MAX_WORDS = 3, 60  # English words of a kept pair
PAGE_RE = re.compile(r"/man/(?:([\w@-]+)/)?man(\d)/([^/]+)\.\d\w*\.gz$")


def packages(languages=LANGUAGES) -> tuple[str, ...]:
    return (*ENGLISH_PACKAGES, *(f"manpages-{lang}{dev}" for lang in languages for dev in ("", "-dev")))


def page_sources(debs: list[Path], lang: str | None) -> dict[str, str]:
    """`"<name>(<section>)"` (e.g. `close(2)`, as `manpages` names pages) -> roff source of
    the pages of `lang` (None: English) in `debs`; links (`.so`) left out."""
    pages = {}
    for deb in debs:
        for path, data in deb_members(deb.read_bytes()):
            match = PAGE_RE.search(path)
            if not match or match.group(1) != lang:
                continue
            source = gzip.decompress(data).decode("utf-8", errors="replace")
            if not re.match(r"\.so\s", source.lstrip()):
                pages[f"{match.group(3)}({match.group(2)})"] = source
    return pages


def _requests(source: str) -> list[str]:
    """The break requests of a roff source, in order."""
    return [line.split()[0] for line in source.splitlines() if line.startswith(".") and line.split()[0] in BREAKS]


def without_appended_sections(english: str, translation: str) -> str:
    """`translation` cut before the sections its translators appended after the English ones
    (po4a's addenda: translator credits), with the break request just before them."""
    sections = sum(line.split()[0] == ".SH" for line in english.splitlines() if line.startswith(".SH"))
    lines, seen = translation.splitlines(), 0
    for i, line in enumerate(lines):
        if line.startswith(".SH") and line.split()[0] == ".SH":
            seen += 1
            if seen > sections:
                kept = lines[:i]
                while kept and (not kept[-1].strip() or kept[-1].split()[0] in BREAKS - {".SH", ".SS"}):
                    kept.pop()
                return "\n".join(kept) + "\n"
    return translation


def aligned_paragraphs(english: str, translation: str) -> list[tuple[str, str]] | None:
    """[(English paragraph, translated paragraph)] of a page pair, or None when the two do not
    have the same structure (break requests and paragraph count)."""
    translation = without_appended_sections(english, translation)
    if _requests(english) != _requests(translation):
        return None
    ours, theirs = roff_paragraphs(english), roff_paragraphs(translation)
    if len(ours) != len(theirs):
        return None
    return list(zip(ours, theirs))


def _sentences(paragraph: str) -> list[str]:
    return [s.strip() for s in SENTENCE_RE.split(paragraph.strip()) if s.strip()]


def translation_pairs(paragraphs: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """(translated, English) pairs of aligned paragraphs: sentence pairs where both sides have
    the same number of sentences, else the paragraph pair. Dropped: no-fill blocks, untranslated
    text, English of fewer than MIN_WORDS or more than MAX_WORDS words or without final
    punctuation (headings), and pairs of disagreeing lengths."""
    pairs = []
    for english, translated in paragraphs:
        if "\n" in english or "\n" in translated or english == translated:
            continue
        english, translated = english.strip(), translated.strip()
        ours, theirs = _sentences(english), _sentences(translated)
        for en, tr in zip(ours, theirs) if len(ours) == len(theirs) else [(english, translated)]:
            if (en != tr and MIN_WORDS <= len(en.split()) <= MAX_WORDS and en[-1:] in ".!?:;)"
                    and max(len(en), len(tr)) <= MAX_RATIO * min(len(en), len(tr))):
                pairs.append((tr, en))
    return pairs


def parallel_records(debs: list[Path], languages=LANGUAGES) -> tuple[list[dict], dict]:
    """Every aligned pair of every language, and per language the counts of pages translated,
    aligned and discarded."""
    english = page_sources(debs, None)
    records, stats = [], {}
    for lang in languages:
        translated = page_sources([d for d in debs if d.name.split("_")[0] in (f"manpages-{lang}", f"manpages-{lang}-dev")], lang)
        common = sorted(set(english) & set(translated))
        aligned = {name: aligned_paragraphs(english[name], translated[name]) for name in common}
        kept = {name: translation_pairs(par) for name, par in aligned.items() if par is not None}
        stats[lang] = {"translated_pages": len(translated), "with_english": len(common), "aligned": len(kept),
                       "discarded": len(common) - len(kept), "pairs": sum(map(len, kept.values()))}
        records += [{"source": tr, "target": en, "lang": lang, "page": name}
                    for name, pairs in kept.items() for tr, en in pairs]
    return records, stats


def _split_records(records: list[dict], validation_percent: int) -> dict[str, list[dict]]:
    """By a hash of the page name, the split of `manpages` (so a model pretrained on the
    English man-pages never saw a validation page); duplicates dropped, and validation pairs
    whose source or target is also a training one; the validation pairs shuffled (seed 0)."""
    rows = {"train": [], "validation": []}
    for record in records:
        held = int(hashlib.sha1(record["page"].encode()).hexdigest(), 16) % 100 < validation_percent
        rows["validation" if held else "train"].append(record)
    train_sides = {r["source"] for r in rows["train"]} | {r["target"] for r in rows["train"]}
    rows["validation"] = [r for r in rows["validation"] if r["source"] not in train_sides and r["target"] not in train_sides]
    for name, split in rows.items():
        seen, rows[name] = set(), []
        for record in split:  # the first of each pair
            if (record["source"], record["target"]) not in seen:
                seen.add((record["source"], record["target"]))
                rows[name].append(record)
    random.Random(0).shuffle(rows["validation"])  # its first n pairs (num_generation_examples) sample every page
    return rows


def load_manpages_l10n_dataset(config: str = "de-en", validation_percent: int = 5, cache: Path = CACHE):
    """`DatasetDict(train, validation)` of `{"source", "target", "lang", "page"}` pairs:
    `config` is `<lang>-en` (a language of `LANGUAGES`) or `x-en` (all of them)."""
    from datasets import Dataset, DatasetDict

    configs = [f"{lang}-en" for lang in LANGUAGES] + ["x-en"]
    if config not in configs:
        raise ValueError(f"dataset_config {config!r} of debian_manpages_l10n is not one of {configs}.")
    languages = LANGUAGES if config == "x-en" else (config.split("-")[0],)
    records, _ = parallel_records(sorted(fetch_packages(cache, packages(languages)).values()), languages)
    rows = _split_records(records, validation_percent)
    return DatasetDict({name: Dataset.from_list(split) for name, split in rows.items()})
