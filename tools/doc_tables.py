"""The repository's generated tables: each stands in a Markdown file between two markers, written
from the facts it shows, never typed by hand, and `tests/test_docs.py` checks that every one is
current (a hand edit, or a results file or head class changed without a rerun, fails it).

    python -m tools.doc_tables            # rewrite every generated table of the repository
    python -m tools.doc_tables --check    # say which tables are not current (exit status 1)

The tables (`TABLES`), each named in its begin marker:
  - `regimes` (studies/results/regimes.md): every run of every regime against its best plain head
    (`regimes.regime_table` of `regimes.REGIMES`);
  - `heads` (README.md): one row per registered head: its papers and its plain export (the head
    class's `papers`, `exact_plain_export`) and, per regime, its runs against the best plain head
    (the regimes' `results.json`);
  - `serving` (hf_outheads/README.md): what `export_plain` writes for each head, on the families
    with and without an output bias (`exact_plain_export`, `plain_export_limit`);
  - `families` (hf_outheads/README.md): the transformers families `from_backbone` converts exactly and
    those it refuses, with the reason, and `unbuilt_families` (studies/results/families.md): those the
    sweep could not build here or did not try, with the reason (`studies/results/families.json`, written
    by `python -m studies.family_sweep`).
A new head gets its rows from its class and, once a regime has run it, its results; a new regime
is a line of `regimes.REGIMES`; a new transformers release, a rerun of the family sweep. Rerun this
command after any of them.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from hf_outheads import HEAD_CLASSES
from hf_outheads.head_interface import Paper
from studies.family_sweep import RESULTS as FAMILIES
from studies.regimes import REGIMES, RESULTS, regime_table

ROOT = Path(__file__).resolve().parents[1]
BEGIN = re.compile(r"<!-- generated table `(?P<name>\w+)`[^\n]*-->\n")
END = "<!-- end of the generated table -->"
COMMAND = "python -m tools.doc_tables"


def bibtex_field(bibtex: str, name: str) -> str | None:
    """The value of field `name` of a BibTeX entry (braces one level deep inside it kept)."""
    found = re.search(rf"\b{name}\s*=\s*\{{([^{{}}]*(?:\{{[^{{}}]*\}}[^{{}}]*)*)\}}", bibtex)
    return found.group(1) if found else None


def short_citation(paper: Paper) -> str:
    """"Press & Wolf 2017", "Yang et al. 2018": the surnames and year of the paper's BibTeX entry
    (its title where the entry names no author or year)."""
    authors, year = bibtex_field(paper.bibtex, "author"), bibtex_field(paper.bibtex, "year")
    if not authors or not year:
        return paper.title
    surnames = [author.split(",")[0].strip("{} ") for author in authors.split(" and ")]
    names = surnames[0] if len(surnames) == 1 else " & ".join(surnames) if len(surnames) == 2 else f"{surnames[0]} et al."
    return f"{names} {year}"


def paper_links(papers: tuple[Paper, ...]) -> str:
    """Each paper as its short citation, linked to its arXiv page (else its own URL)."""
    links = [f"[{short_citation(p)}]({f'https://arxiv.org/abs/{p.arxiv}' if p.arxiv else p.url})" for p in papers]
    return "; ".join(links) or "none (the plain layer)"


def signed(value: float, percent: bool = True) -> str:
    return f"{100 * value:+.1f}%" if percent else f"{value:+.2f}"


def seeds_better(row: dict, best: dict, metric: str, higher_is_better: bool) -> str:
    """"(2/3)": at how many paired seeds `row` beat the best plain row on `metric`."""
    mine, theirs = row["per_seed"].get(metric, {}), best["per_seed"].get(metric, {})
    paired = [seed for seed in mine if seed in theirs]
    wins = sum((mine[s] > theirs[s]) if higher_is_better else (mine[s] < theirs[s]) for s in paired)
    return f"({wins}/{len(paired)})"


def run_cell(row: dict, best: dict) -> str:
    """One run against the best plain row: its perplexity change (seeds better), and where the
    comparison generated text, its BLEU change in points (seeds better) first."""
    if row["name"] == best["name"]:
        return "baseline"
    text = f"{signed(row['eval_perplexity_vs_best_plain'])} {seeds_better(row, best, 'eval_perplexity', False)}"
    if "eval_sacrebleu" in row and "eval_sacrebleu" in best:
        bleu = row["eval_sacrebleu"][0] - best["eval_sacrebleu"][0]
        text = f"BLEU {signed(bleu, False)} {seeds_better(row, best, 'eval_sacrebleu', True)}, perplexity {text}"
    return text if row["name"] == row["head"] else f"`{row['name']}` {text}"


def head_table() -> str:
    """README.md's head table (see the module docstring)."""
    results = {folder: json.loads((RESULTS / folder / "results.json").read_text()) for folder in REGIMES}
    header = ["head", "papers", "exports exactly as a stock model"]
    for folder, label in REGIMES.items():
        header.append(f"[{label}](studies/results/{folder}/results.md) vs `{results[folder]['best_plain']}`")
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    for head_type, cls in HEAD_CLASSES.items():
        cells = [f"`{head_type}`", paper_links(cls.papers), "yes" if cls.exact_plain_export else "no"]
        for result in results.values():
            best = next(row for row in result["rows"] if row["name"] == result["best_plain"])
            runs = sorted((row for row in result["rows"] if row.get("head") == head_type),
                          key=lambda row: row["name"] != head_type)  # the head's own run first, then its variants
            cells.append("; ".join(run_cell(row, best) for row in runs))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


NO_BIAS, BIAS = "GPT-2, Llama, Qwen2, Mistral, T5 (no output bias in the class)", "BART, Marian (`final_logits_bias`)"


def serving_cells(cls) -> tuple[str, str]:
    """What `export_plain` writes for a head with its default options, on each kind of family."""
    limit = cls.plain_export_limit
    if not cls.exact_plain_export:
        return f"not at all: {limit}", "not at all"
    caveat = f"; {limit}" if limit else ""
    return (f"exact with `output_bias: false` (or a bias still at zero); else refused, or approximate on "
            f"request{caveat}", f"exact{caveat}")


def serving_table() -> str:
    """hf_outheads/README.md's serving table: heads with the same cells share a row."""
    rows: dict[tuple[str, str], list[str]] = {}
    for head_type, cls in HEAD_CLASSES.items():
        rows.setdefault(serving_cells(cls), []).append(f"`{head_type}`")
    lines = [f"| head | {NO_BIAS} | {BIAS} |", "| --- | --- | --- |"]
    lines += [f"| {', '.join(heads)} | {no_bias} | {bias} |" for (no_bias, bias), heads in rows.items()]
    return "\n".join(lines) + "\n"


def sweep_rows(*statuses: str) -> tuple[str, list[dict]]:
    """(the transformers version, the family sweep's outcomes with these statuses)."""
    found = json.loads(FAMILIES.read_text())
    return found["transformers"], [o for o in found["outcomes"] if o["status"] in statuses]


def families_table() -> str:
    """hf_outheads/README.md's list of the families converted exactly, and table of those refused."""
    version, exact = sweep_rows("exact")
    _, refused = sweep_rows("refused")
    names = ", ".join(f"`{o['family']}`" for o in exact)
    lines = [f"Exact on transformers {version} ({len(exact)} model classes: logits to 1e-5 in fp32 with logits "
             f"far from 0, loss and greedy tokens): {names}.", "",
             "| refused | class | why |", "| --- | --- | --- |"]
    lines += [f"| `{o['family']}` | `{o['model_class']}` | {o['detail'].split('cannot be converted: ', 1)[-1]} |"
              for o in refused]
    return "\n".join(lines) + "\n"


def unbuilt_families_table() -> str:
    """studies/results/families.md's table of the families the sweep could not build or did not try."""
    version, rows = sweep_rows("unbuildable", "skipped")
    lines = [f"| family (transformers {version}) | class | outcome | why |", "| --- | --- | --- | --- |"]
    lines += [f"| `{o['family']}` | `{o['model_class']}` | {o['status']} | {o['detail'].replace('|', '/')} |"
              for o in rows]
    return "\n".join(lines) + "\n"


TABLES = {"regimes": lambda: regime_table([RESULTS / folder for folder in REGIMES]), "heads": head_table,
          "serving": serving_table, "families": families_table, "unbuilt_families": unbuilt_families_table}


def blocks(text: str) -> list[tuple[str, int, int]]:
    """(table name, start, end) of every generated table in `text`: what lies between the end of
    its begin marker and its end marker."""
    found = []
    for begin in BEGIN.finditer(text):
        end = text.index(END, begin.end())
        found.append((begin.group("name"), begin.end(), end))
    return found


def marker(name: str) -> str:
    return f"<!-- generated table `{name}`: rerun `{COMMAND}` after a change of what it shows; do not edit it -->\n"


def held_and_current(path: Path) -> list[tuple[str, str, str]]:
    """(name, the table `path` holds, the table as generated now) for each generated table of `path`."""
    text = path.read_text()
    return [(name, text[start:end].strip(), TABLES[name]().strip()) for name, start, end in blocks(text)]


def rewrite(path: Path) -> list[str]:
    """Write the current tables into `path` between their markers; the names of those that changed."""
    text, changed = path.read_text(), []
    for name, start, end in reversed(blocks(text)):
        table = "\n" + TABLES[name]() + "\n"
        if text[start:end].strip() != table.strip():
            changed.append(name)
        text = text[:start] + table + text[end:]
    path.write_text(text)
    return changed


def documents() -> list[Path]:
    """Every Markdown file of the repository that holds a generated table (dot-folders and
    `outputs` left out)."""
    files = [path for path in sorted(ROOT.rglob("*.md"))
             if not any(part.startswith(".") or part == "outputs" for part in path.relative_to(ROOT).parts)]
    return [path for path in files if BEGIN.search(path.read_text())]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="Write nothing; list the tables that are not current.")
    args = parser.parse_args(argv)
    stale = []
    for path in documents():
        if args.check:
            stale += [f"{path.relative_to(ROOT)}: {name}" for name, held, now in held_and_current(path) if held != now]
        else:
            stale += [f"{path.relative_to(ROOT)}: {name}" for name in rewrite(path)]
    print(("Not current:\n  " if args.check else "Rewritten:\n  ") + "\n  ".join(stale) if stale else "Every table is current.")
    if args.check and stale:
        sys.exit(1)


if __name__ == "__main__":
    main()
