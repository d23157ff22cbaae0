"""Every causal and encoder-decoder family of the installed transformers, converted with large logits
(`studies/family_sweep.py`): none converts silently to other logits, loss or cached greedy generation, and
what each one does (exact, refused with its reason, not buildable here with its reason, skipped) is what
`studies/results/families.json` records and docs/families.md's generated list shows, so that a new
transformers release shows what it broke (rerun `python -m studies.family_sweep`, then
`python -m maintainer.doc_tables`)."""

from __future__ import annotations

import json

import transformers

from studies.family_sweep import RESULTS, record, sweep

RERUN = "rerun `python -m studies.family_sweep` and `python -m maintainer.doc_tables`, and read the diff"


def test_every_family_converts_exactly_or_is_refused_by_name():
    found = record(sweep())
    differs = [o for o in found["outcomes"] if o["status"] == "differs"]
    assert not differs, f"converted without a word, to other outputs: {differs}"
    recorded = json.loads(RESULTS.read_text())
    key = lambda outcome: (outcome["family"], outcome["model_class"])
    was, now = ({key(o): o for o in r["outcomes"]} for r in (recorded, found))
    changed = {k: (was.get(k), now.get(k)) for k in was.keys() | now.keys() if was.get(k) != now.get(k)}
    assert not changed, (f"transformers {transformers.__version__} (recorded: {recorded['transformers']}): the sweep "
                         f"differs from {RESULTS.name} for {len(changed)} families: {changed}; {RERUN}")
