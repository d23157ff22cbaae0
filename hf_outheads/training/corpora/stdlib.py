"""A corpus that exists on every machine: the docstrings of the Python standard library.

Two tasks are built from it at run time, with no download:
  - `text`: one record per documented module, class, function or method,
    `"<qualified name><signature>\\n<docstring>"` (language modelling).
  - `summary`: `source` = `"<qualified name><signature>"`, `target` = the docstring's first
    sentence: writing a function's summary line from its name and parameters, the
    docstring-generation task of code-summarisation datasets (CodeSearchNet). The name and
    parameters carry many of the summary's content words ("os.path.join(a, *p)" -> "Join two
    or more pathname components, ..."), and BLEU/chrF/ROUGE measure it as they measure
    summarisation. It is hard for a model trained from scratch on ~1,700 pairs: in the
    quickstart's budget the model learns the summaries' language (perplexity drops ~40x)
    before it learns to use the source; see training/README.md.
  - `restore`: case and punctuation restoration of the docstrings' sentences (the man-pages
    corpus's `restore` task, `manpages.restore_pairs`, on each docstring's paragraphs
    joined into lines); each target once.
  - `restore_short`: `restore` on the sentences of 6 to 16 words only. A tiny model trained
    from scratch learns it within the quickstart's minute (it first has to learn to copy
    its source, and short sentences are copied sooner).

Only an allowlist of modules is imported: importing arbitrary stdlib modules can open a
window (turtle, tkinter, idlelib), a browser (antigravity) or print (this). The walk runs
in a fresh, isolated interpreter (`python -I`), so that neither the modules the caller has
imported (some patch stdlib classes) nor the walk's own imports leak into the other: the
corpus is the same for a given Python version, wherever and however that Python is started. The split is by a hash of the record's name.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import json
import re
import subprocess
import sys

SAFE_MODULES = (
    "abc argparse ast base64 bisect bz2 calendar cmath codecs collections colorsys configparser "
    "contextlib copy csv dataclasses datetime decimal difflib email.message email.utils enum filecmp "
    "fnmatch fractions ftplib functools getopt gettext glob graphlib gzip hashlib heapq hmac html "
    "html.parser http.client http.cookies imaplib inspect io ipaddress itertools json keyword "
    "linecache locale logging logging.handlers lzma mailbox math mimetypes numbers operator optparse "
    "os os.path pathlib pickle pkgutil platform plistlib poplib pprint queue quopri random re reprlib "
    "sched secrets selectors shelve shlex shutil smtplib socket socketserver sqlite3 ssl statistics "
    "string stringprep struct subprocess sysconfig tarfile tempfile textwrap threading time timeit "
    "token tokenize traceback types typing unittest unittest.mock urllib.parse urllib.request uuid "
    "warnings wave weakref xml.dom.minidom xml.etree.ElementTree zipfile zlib"
).split()

_SENTENCE_END = re.compile(r"(?<=[.!?])\s")
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")  # object reprs in default values change every run


def _doc(obj) -> str | None:
    """The object's own docstring (not inherited), dedented; None if missing or trivial."""
    doc = getattr(obj, "__doc__", None)
    if not isinstance(doc, str) or len(doc.strip()) < 10:
        return None
    return inspect.cleandoc(doc)


def _signature(obj) -> str:
    """The signature as written, with what depends on the machine made fixed: object addresses
    dropped, and the interpreter's path (a default of `platform.architecture`: it is where and
    how Python was started, `.../bin/python` or `.../bin/python3`) written `sys.executable`."""
    try:
        return _ADDRESS.sub("", str(inspect.signature(obj))).replace(repr(sys.executable), "sys.executable")
    except (TypeError, ValueError):
        return "" if inspect.isclass(obj) else "(...)"


def _members(module):
    """(qualified name, object) for the module and the public classes, functions and
    methods it defines itself, in alphabetical order."""
    yield module.__name__, module
    for name, obj in sorted(vars(module).items()):
        if name.startswith("_") or getattr(obj, "__module__", None) != module.__name__:
            continue
        if inspect.isfunction(obj) or inspect.isbuiltin(obj):
            yield f"{module.__name__}.{name}", obj
        elif inspect.isclass(obj):
            yield f"{module.__name__}.{name}", obj
            for attr, member in sorted(vars(obj).items()):
                if not attr.startswith("_") and (inspect.isfunction(member) or inspect.isbuiltin(member)):
                    yield f"{module.__name__}.{name}.{attr}", member


def iter_docstrings(modules=SAFE_MODULES):
    """Yield (qualified name, signature, docstring), each docstring once."""
    seen = set()
    for module_name in modules:
        try:
            module = importlib.import_module(module_name)
        except Exception:  # missing optional C extension (lzma, sqlite3, ...): skip it
            continue
        for qualname, obj in _members(module):
            doc = _doc(obj)
            if doc is None or doc in seen:
                continue
            seen.add(doc)
            yield qualname, ("" if inspect.ismodule(obj) else _signature(obj)), doc


def first_sentence(doc: str) -> str:
    paragraph = " ".join(doc.split("\n\n")[0].split())
    return _SENTENCE_END.split(paragraph, maxsplit=1)[0]


def _split_of(name: str, validation_percent: int) -> str:
    bucket = int(hashlib.sha1(name.encode()).hexdigest(), 16) % 100
    return "validation" if bucket < validation_percent else "train"


def build_records(task: str, validation_percent: int = 10) -> dict[str, list[dict]]:
    """{"train": [...], "validation": [...]} records for `task` ('text' or 'summary')."""
    if task not in ("text", "summary"):
        raise ValueError(f"Unknown stdlib_docstrings task {task!r}: use 'text' or 'summary'.")
    splits: dict[str, list[dict]] = {"train": [], "validation": []}
    targets = set()
    for qualname, signature, doc in iter_docstrings():
        if task == "text":
            record = {"text": f"{qualname}{signature}\n{doc}"}
        else:
            target = first_sentence(doc)
            short_name = qualname.rsplit(".", 1)[-1]
            if (target in targets or not 3 <= len(target.split()) <= 40 or len(signature) > 200
                    or target.startswith((short_name + "(", short_name + " ="))):
                continue  # duplicates would leak across splits; overlong ones, signatures and grammar rules are not summaries
            targets.add(target)
            record = {"source": f"{qualname}{signature}", "target": target}
        splits[_split_of(qualname, validation_percent)].append(record)
    return splits


def build_records_isolated(task: str, validation_percent: int = 10) -> dict[str, list[dict]]:
    """`build_records` run in a fresh `python -I` interpreter."""
    command = [sys.executable, "-I", __file__, task, str(validation_percent)]
    done = subprocess.run(command, capture_output=True, text=True, check=True, stdin=subprocess.DEVNULL, timeout=300)
    return json.loads(done.stdout)


RESTORE_MAX_WORDS = {"restore": 30, "restore_short": 16}  # config -> longest sentence kept (words)
TASKS = ("text", "summary", *RESTORE_MAX_WORDS)


def restore_records(text_records: dict[str, list[dict]], max_words: int = 30) -> dict[str, list[dict]]:
    """The `restore` task's splits from the `text` task's (same split of each docstring),
    sentences of 6 to `max_words` words."""
    from hf_outheads.training.corpora.manpages import restore_pairs

    splits, targets = {}, set()
    for split, rows in text_records.items():
        splits[split] = []
        for row in rows:
            header, _, doc = row["text"].partition("\n")
            paragraphs = [" ".join(paragraph.split()) for paragraph in doc.split("\n\n")]
            for pair in restore_pairs("\n".join([header, *paragraphs]), max_words=max_words):
                if pair["target"] not in targets:  # a repeated sentence would leak across splits
                    targets.add(pair["target"])
                    splits[split].append(pair)
    return splits


def load_stdlib_dataset(task: str, validation_percent: int = 10):
    """The corpus as a `datasets.DatasetDict` with `train` and `validation` splits
    (`task`: one of `TASKS`)."""
    from datasets import Dataset, DatasetDict

    if task not in TASKS:
        raise ValueError(f"Unknown stdlib_docstrings task {task!r}: use one of {', '.join(map(repr, TASKS))}.")
    restore = task in RESTORE_MAX_WORDS
    records = build_records_isolated("text" if restore else task, validation_percent)
    if restore:
        records = restore_records(records, RESTORE_MAX_WORDS[task])
    return DatasetDict({split: Dataset.from_list(rows) for split, rows in records.items()})


if __name__ == "__main__":
    print(json.dumps(build_records(sys.argv[1], int(sys.argv[2]))))
