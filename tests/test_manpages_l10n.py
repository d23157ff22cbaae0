"""The parallel corpus of translated man pages (hf_outheads/training/corpora/manpages_l10n.py), the copy
baseline of generation metrics (hf_outheads/training/evaluation.py `copy_scores`), the seq2seq tables
(studies/comparison_tables.py `generation_table`) and the seq2seq regime configs."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from hf_outheads.training import data as data_lib
from hf_outheads.training.corpora import manpages_l10n as l10n
from hf_outheads.training.options import parse_options
from studies import compare_heads
from studies.comparison_tables import generation_table, summarise
from test_study import fake_deb

ENGLISH = r'''.TH close 2 2022-10-30 "Linux man-pages 6.03"
.SH NAME
close \- close a file descriptor
.SH DESCRIPTION
.BR close ()
closes a file descriptor, so that it no longer refers to any file.
Any record locks held on the file are removed.
.PP
If
.I fd
is the last file descriptor, the resources are freed.
.TP
.B EBADF
.I fd
isn't a valid open file descriptor.
.PP
.nf
int close(int fd);
.fi
.PP
This paragraph is not translated yet.
'''

GERMAN = r'''.TH close 2 "30. Oktober 2022" "Linux man\-pages 6.03"
.SH BEZEICHNUNG
close \- Dateideskriptor schließen
.SH BESCHREIBUNG
\fBclose\fP() schließt einen Dateideskriptor, so dass dieser nicht mehr zu einer Datei gehört.
Alle Datensatz\-Sperren der Datei werden aufgehoben.
.PP
Wenn \fIdd\fP der letzte Deskriptor ist, werden die Ressourcen freigegeben.
.TP 
\fBEBADF\fP
\fIdd\fP ist kein gültiger Deskriptor.
.PP
.nf
int close(int fd);
.fi
.PP
This paragraph is not translated yet.
.PP
.SH ÜBERSETZUNG
Die deutsche Übersetzung wurde von Übersetzern erstellt.
'''


def test_a_translated_page_aligns_paragraph_by_paragraph_without_the_translators_section():
    paragraphs = l10n.aligned_paragraphs(ENGLISH, GERMAN)
    assert paragraphs is not None and len(paragraphs) == 8  # 2 headings, 2 + 2 + 1 paragraphs, code, untranslated
    assert not any("Übersetzung" in theirs for _, theirs in paragraphs)
    pairs = l10n.translation_pairs(paragraphs)
    # the two-sentence paragraph became two sentence pairs; headings, code and English left out
    assert pairs == [
        ("close() schließt einen Dateideskriptor, so dass dieser nicht mehr zu einer Datei gehört.",
         "close() closes a file descriptor, so that it no longer refers to any file."),
        ("Alle Datensatz-Sperren der Datei werden aufgehoben.", "Any record locks held on the file are removed."),
        ("Wenn dd der letzte Deskriptor ist, werden die Ressourcen freigegeben.",
         "If fd is the last file descriptor, the resources are freed."),
        ("EBADF dd ist kein gültiger Deskriptor.", "EBADF fd isn't a valid open file descriptor."),
    ]


@pytest.mark.parametrize("change", [
    lambda page: page.replace("aufgehoben.\n.PP\n", "aufgehoben.\n.PP\nEin Absatz mehr.\n.PP\n"),  # a paragraph more
    lambda page: page.replace(".TP \n", ".IP \n"),  # another layout request
    lambda page: page.replace(".SH BESCHREIBUNG\n", ""),  # a section fewer
])
def test_a_page_whose_structure_differs_is_discarded(change):
    assert l10n.aligned_paragraphs(ENGLISH, change(GERMAN)) is None


def test_dataset_from_cached_packages_splits_by_page_and_keeps_validation_apart(tmp_path):
    english, german = {}, {}
    for i in range(30):
        english[f"./usr/share/man/man2/call{i}.2.gz"] = ENGLISH.replace("close", f"call{i}")
        german[f"./usr/share/man/de/man2/call{i}.2.gz"] = GERMAN.replace("close", f"call{i}")
    german["./usr/share/man/de/man1/other.1.gz"] = GERMAN  # no English original here: not used
    for package in l10n.packages(("de",)):
        pages = english if package == "manpages" else german if package == "manpages-de" else {}
        (tmp_path / f"{package}_1.0_all.deb").write_bytes(fake_deb(pages))
    data = l10n.load_manpages_l10n_dataset("de-en", validation_percent=20, cache=tmp_path)
    assert set(data["train"].column_names) == {"source", "target", "lang", "page"}
    pages = {split: set(data[split]["page"]) for split in data}
    assert pages["train"] | pages["validation"] == {f"call{i}(2)" for i in range(30)}
    assert pages["validation"] and not pages["train"] & pages["validation"]
    # a page's first pair names its page; its 3 others are on every page: once in train, not in validation
    assert list(data["train"]["target"]).count("Any record locks held on the file are removed.") == 1
    assert "Any record locks held on the file are removed." not in list(data["validation"]["target"])
    assert len(data["train"]) == len(pages["train"]) + 3 and len(data["validation"]) == len(pages["validation"])
    with pytest.raises(ValueError, match="not one of"):
        l10n.load_manpages_l10n_dataset("en-de", cache=tmp_path)


@pytest.mark.downloads("Debian's manpages, manpages-dev, manpages-it and manpages-it-dev, with apt-get download")
@pytest.mark.skipif(shutil.which("apt-get") is None, reason="apt-get is not installed (not a Debian/Ubuntu machine)")
def test_the_real_italian_pages_align_with_the_english_ones():
    """The smallest language of the corpus, from Debian's archive with `apt-get download`
    (about 4 MB, cached in ~/.cache/hf_outheads)."""
    try:
        debs = sorted(l10n.fetch_packages(l10n.CACHE, l10n.packages(("it",))).values())
    except RuntimeError as error:
        pytest.skip(f"the manpages packages cannot be downloaded here: {error}")
    records, stats = l10n.parallel_records(debs, ("it",))
    assert stats["it"]["aligned"] >= 0.9 * stats["it"]["with_english"] > 50  # po4a keeps the structure
    assert len(records) > 1000
    assert all(r["source"] != r["target"] and "\n" not in r["source"] for r in records)


def test_the_copied_source_is_scored_as_a_prediction():
    from hf_outheads.training.evaluation import copy_scores

    scores = copy_scores(["sacrebleu", "chrf"], ["translate: the cat sat on the mat", "translate: a dog"],
                         ["the cat sat on the mat", "a cat"], prefix="translate: ")
    assert set(scores) == {"eval_copy_sacrebleu", "eval_copy_chrf"}
    assert 0 < scores["eval_copy_sacrebleu"] < 100 and 0 < scores["eval_copy_chrf"] < 100
    assert copy_scores(["sacrebleu"], ["x: a b c d e"], ["a b c d e"], prefix="x: ")["eval_copy_sacrebleu"] == pytest.approx(100)


def seq2seq_run(name, seed, bleu, curve, flops_per_step=1e12):
    return {"name": name, "head": name, "head_options": {}, "seed": seed, "eval_perplexity": 10.0,
            "eval_sacrebleu": bleu, "eval_chrf": bleu + 20, "eval_copy_sacrebleu": 5.0, "eval_copy_chrf": 30.0,
            "parameters": 100, "head_parameters": 10, "train_step_time_s": 0.1, "train_flops": flops_per_step * curve[-1][0],
            "curve": [{"step": s, "train_flops": s * flops_per_step, "eval_perplexity": 10.0, "eval_sacrebleu": b}
                      for s, b in curve]}


def test_generation_table_compares_bleu_with_the_best_plain_head_and_the_copied_source():
    runs = [seq2seq_run("tied", 1, 20.0, [(10, 10.0), (20, 20.0)]), seq2seq_run("tied", 2, 22.0, [(10, 12.0), (20, 22.0)]),
            seq2seq_run("linear", 1, 18.0, [(10, 9.0), (20, 18.0)]), seq2seq_run("linear", 2, 19.0, [(10, 9.0), (20, 19.0)]),
            # twice the FLOPs per step: at the others' budget it is at its step 10
            seq2seq_run("mos", 1, 21.5, [(10, 15.0), (20, 21.5)], 2e12), seq2seq_run("mos", 2, 22.5, [(10, 16.0), (20, 22.5)], 2e12)]
    rows, _ = summarise(runs)
    table = generation_table(rows, runs)
    assert "| copy source |  | 5.00 ± 0.00 | -16.00 |  |  |  |  | 30.00 ± 0.00 | -11.00 |  |" in table  # tied: 21, 41
    assert "| mos | 2 | 22.00 ± 0.71 | +1.00 | 2/2 | 1/2 | 15.50 | -5.50 | 42.00 ± 0.71 | +1.00 | 10.00 |" in table
    assert "| tied | 2 | 21.00 ± 1.41 | +0.00 | 0/2 | 0/2 | 21.00 | +0.00 |" in table
    assert "`tied` is 16.00 BLEU above it" in table
    assert generation_table(summarise(RUNS_WITHOUT_BLEU)[0], RUNS_WITHOUT_BLEU) == ""


RUNS_WITHOUT_BLEU = [{"name": "tied", "head": "tied", "head_options": {}, "seed": 1, "eval_perplexity": 9.0,
                      "parameters": 1, "head_parameters": 1, "train_step_time_s": 0.1, "curve": []}]

SEQ2SEQ_REGIMES = ["compare_translate_manpages.yaml", "compare_finetune_translate_manpages.yaml",
                   "compare_restore_short_stdlib.yaml"]


@pytest.mark.parametrize("name", SEQ2SEQ_REGIMES)
def test_the_seq2seq_regime_configs_load_and_name_valid_heads(name):
    config = Path(__file__).resolve().parents[1] / "studies" / "configs" / name
    options = parse_options(["--config", str(config)])
    assert options.model.task == "seq2seq" and options.data.dataset_name in (data_lib.MANPAGES_L10N, data_lib.BUILTIN)
    assert options.training.generation_metrics == ["sacrebleu", "chrf"] and options.training.generation_num_beams == 4
    heads = re.search(r"--heads (\S+)", config.read_text()).group(1).split(",")  # the documented command
    assert {"tied", "linear", "joint", "drill", "drill-own", "mos", "sigsoftmax"} <= set(heads)
    specs = compare_heads.run_specs(options, heads)  # every name resolves to a registered head and its options
    assert specs["drill-own"][0] == "drill" and specs["drill-own"][1]["labels"] == "own"
    assert specs["mos"][1]["num_components"] == 5
