"""Held-out text for checking the heads' defaults: not a corpus any repository config trains on.
The English paragraphs of The Debian Administrator's Handbook (Debian package `debian-handbook`),
shuffled (seed 0) and split 95/5 into `train.jsonl` and `validation.jsonl` (`{"text": ...}` lines):

    apt-get download debian-handbook && dpkg-deb -x debian-handbook_*.deb /tmp/handbook
    python -m hf_outheads.training.corpora.debian_handbook /tmp/handbook data/debian_handbook

(2,764 training paragraphs of 143,785 words, 146 validation paragraphs of 7,498 words; used by
studies/configs/heldout_debian_handbook_lm.yaml.)
"""

from __future__ import annotations

import html.parser
import json
import random
import sys
from pathlib import Path

PAGES = "usr/share/doc/debian-handbook/html/en-US"
MIN_WORDS = 8


class Paragraphs(html.parser.HTMLParser):
    """The text of the DocBook paragraphs (elements with `class="para"`), nested markup flattened."""

    def __init__(self):
        super().__init__()
        self.open: list = []  # [tag, depth] of the paragraph being read
        self.parts: list[str] = []
        self.texts: list[str] = []

    def handle_starttag(self, tag, attrs):
        if self.open:
            self.open[1] += tag == self.open[0]
        elif ("class", "para") in attrs:
            self.open, self.parts = [tag, 1], []

    def handle_endtag(self, tag):
        if self.open and tag == self.open[0]:
            self.open[1] -= 1
            if self.open[1] == 0:
                self.open, text = [], " ".join("".join(self.parts).split())
                if len(text.split()) >= MIN_WORDS:
                    self.texts.append(text)

    def handle_data(self, data):
        if self.open:
            self.parts.append(data)


def build(root: Path, out: Path) -> dict[str, int]:
    texts = []
    for page in sorted((root / PAGES).glob("*.html")):
        parser = Paragraphs()
        parser.feed(page.read_text(errors="replace"))
        texts += parser.texts
    random.Random(0).shuffle(texts)
    cut = len(texts) * 95 // 100
    out.mkdir(parents=True, exist_ok=True)
    sizes = {}
    for name, part in (("train", texts[:cut]), ("validation", texts[cut:])):
        (out / f"{name}.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in part))
        sizes[name] = len(part)
    return sizes


if __name__ == "__main__":
    print(build(Path(sys.argv[1]), Path(sys.argv[2])))
