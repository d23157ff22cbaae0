"""The repository's generated tables: each stands in a Markdown file between two markers, written
from the facts it shows, never typed by hand, and `tests/test_docs.py` checks that every one is
current (a hand edit, or a results file or head class changed without a rerun, fails it).

    python -m maintainer.doc_tables            # rewrite every generated table of the repository
    python -m maintainer.doc_tables --check    # say which tables are not current (exit status 1)

The tables (`TABLES`), each named in its begin marker:
  - `regimes` (studies/results/regimes.md): every run of every regime against its best plain head
    (`regimes.regime_table` of `regimes.REGIMES`);
  - `heads` (README.md): one row per registered head: its papers (the head class's `papers`), where
    it helped most, by how much, against which plain head and at what training FLOPs a step, or
    "no gain measured" (`head_summary`), and its run at GPT-2-small size (the regimes' `results.json`);
  - `regime_groups` (studies/README.md): every run of every regime against the best plain head, in
    tables of at most six columns (`REGIME_GROUPS`);
  - `serving` (hf_outheads/README.md): what `export_plain` writes for each head, on the families
    with and without an output bias (`exact_plain_export`, `plain_export_limit`);
  - `example_card` (model_cards/README.md): the card `model.create_model_card` renders for a GPT-2
    model with a `drill` head (`example_card`), so a change of the template shows in review;
  - `families` (docs/families.md): the transformers families `from_backbone` converts exactly and
    those it refuses, with the reason, and `unbuilt_families` (studies/results/families.md): those the
    sweep could not build here or did not try, with the reason (`studies/results/families.json`, written
    by `python -m studies.family_sweep`).
A new head gets its rows from its class and, once a regime has run it, its results; a new regime
is a line of `regimes.REGIMES` and a place in `REGIME_GROUPS`; a new transformers release, a rerun of
the family sweep. Rerun this command after any of them.
"""

from __future__ import annotations

import argparse
import dataclasses
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
COMMAND = "python -m maintainer.doc_tables"
PLAIN = ("linear", "tied")  # the plain heads, the references of every comparison
GPU_REGIME = "scale_gpt2small"  # README.md's head table gives it a column of its own
# studies/README.md's tables of every run: the regimes (`REGIMES`) in groups of at most five
REGIME_GROUPS = {
    "Language models trained from scratch": ["regime_scratch", "regime_rank", "regime_heldout", "regime_scarce",
                                             GPU_REGIME],
    "Pretrained models converted and fine-tuned": ["regime_finetune", "mtp_finetune", "mtp_finetune_6l"],
    "Sequence to sequence": ["regime_restore_scratch", "regime_restore_finetune"],
}


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


def change(row: dict, reference: dict, metric: str = "eval_perplexity", percent: bool = True) -> float:
    """The change of `row`'s mean `metric` against `reference`'s: relative, or in points."""
    mine, theirs = row[metric][0], reference[metric][0]
    return mine / theirs - 1.0 if percent else mine - theirs


def run_cell(row: dict, best: dict) -> str:
    """One run against a reference run (the best plain head): its perplexity change (seeds better),
    and where the comparison generated text, its BLEU change in points (seeds better) first."""
    if row["name"] == best["name"]:
        return "baseline"
    text = f"{signed(change(row, best))} {seeds_better(row, best, 'eval_perplexity', False)}"
    if row.get("eval_sacrebleu") and best.get("eval_sacrebleu"):
        bleu = change(row, best, "eval_sacrebleu", percent=False)
        text = f"BLEU {signed(bleu, False)} {seeds_better(row, best, 'eval_sacrebleu', True)}, perplexity {text}"
    return text if row["name"] == row["head"] else f"`{row['name']}` {text}"


def variant_options(row: dict) -> str:
    """The options of a run of a head variant that differ from the head's defaults, as
    "`num_future: 2`, ..." (README.md names no variant)."""
    defaults = {f.name: f.default for f in dataclasses.fields(HEAD_CLASSES[row["head"]].Options)
                if f.default is not dataclasses.MISSING}
    return ", ".join(f"`{name}: {value}`" for name, value in row["head_options"].items()
                     if name in defaults and defaults[name] != value)


def regime_results() -> dict[str, dict]:
    return {folder: json.loads((RESULTS / folder / "results.json").read_text()) for folder in REGIMES}


def reference_run(result: dict, row: dict) -> dict | None:
    """What a run is measured against: its comparison's best plain head, or for the best plain head
    itself the other plain head of the comparison (None where that did not run)."""
    rows = {r["name"]: r for r in result["rows"]}
    if row["name"] != result["best_plain"]:
        return rows[result["best_plain"]]
    return next((rows[name] for name in PLAIN if name in rows and name != row["name"]), None)


def all_seeds_better(row: dict, reference: dict) -> bool:
    wins, paired = seeds_better(row, reference, "eval_perplexity", False).strip("()").split("/")
    return wins == paired and change(row, reference) < 0


def head_summary(head_type: str, results: dict[str, dict]) -> tuple[str, str, str, str]:
    """README.md's cells for one head: (when it helps, by how much, against what, at what training
    FLOPs a step). Its own runs (else its variants) over every regime but the GPU one, each against
    its reference (`reference_run`): the largest perplexity gain among those better at every paired
    seed; where none is, "no gain measured" and the closest run."""
    runs = [(folder, row, reference_run(result, row)) for folder, result in results.items() if folder != GPU_REGIME
            for row in result["rows"] if row.get("head") == head_type]
    own = [run for run in runs if run[1]["name"] == head_type]
    runs = [run for run in (own or runs) if run[2] is not None]
    if not runs:
        return "not run in the comparisons", "", "", ""
    gains = [run for run in runs if all_seeds_better(run[1], run[2])]
    folder, row, reference = min(gains or runs, key=lambda run: change(run[1], run[2]))
    where = f"[{REGIMES[folder]}](studies/results/{folder}/results.md)"
    when = where if gains else f"no gain measured (closest: {where})"
    flops = row["train_flops"] / reference["train_flops"]
    gain = run_cell({**row, "name": row["head"]}, reference)
    gain = gain if gain.startswith("BLEU") else f"perplexity {gain}"
    if row["name"] != row["head"]:
        gain = f"with {variant_options(row)}: {gain}"
    return when, gain, f"`{reference['name']}`", f"{flops:.2f}x"


def head_table() -> str:
    """README.md's head table (see the module docstring)."""
    results = regime_results()
    gpu = results[GPU_REGIME]
    header = ["head", "helps when", "by how much (seeds better)", "against", "training FLOPs a step",
              f"[{REGIMES[GPU_REGIME]}](studies/results/{GPU_REGIME}/results.md) vs `{gpu['best_plain']}`"]
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    gpu_best = next(row for row in gpu["rows"] if row["name"] == gpu["best_plain"])
    for head_type, cls in HEAD_CLASSES.items():
        on_gpu = next((row for row in gpu["rows"] if row["name"] == head_type), None)
        cells = [f"`{head_type}` ({paper_links(cls.papers) if cls.papers else 'the plain layer'})", *head_summary(head_type, results),
                 run_cell(on_gpu, gpu_best) if on_gpu else "not run"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def regime_group_tables() -> str:
    """studies/README.md's tables: per group of regimes (`REGIME_GROUPS`), one row per head that ran in
    one of them, one column per regime: its runs against the best plain head."""
    results = regime_results()
    parts = []
    for title, folders in REGIME_GROUPS.items():
        header = ["head"] + [f"[{REGIMES[f]}](results/{f}/results.md) vs `{results[f]['best_plain']}`" for f in folders]
        lines = [f"**{title}**", "", "| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
        for head_type in HEAD_CLASSES:
            cells = [f"`{head_type}`"]
            for folder in folders:
                result = results[folder]
                best = next(row for row in result["rows"] if row["name"] == result["best_plain"])
                runs = sorted((row for row in result["rows"] if row.get("head") == head_type),
                              key=lambda row: row["name"] != head_type)  # the head's own run first, then its variants
                cells.append("; ".join(run_cell(row, best) for row in runs))
            if any(cells[1:]):
                lines.append("| " + " | ".join(cells) + " |")
        parts.append("\n".join(lines))
    return "\n\n".join(parts) + "\n"


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
             f"far from 0, loss, and cached greedy generation token for token with each step's logits): {names}.", "",
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


def example_card() -> str:
    """model_cards/README.md's example: the card of a small GPT-2 model converted to a `drill` head, as
    `create_model_card` renders it (a Markdown block: its front matter and text)."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    from hf_outheads import OutHeadsForCausalLM

    torch.manual_seed(0)
    backbone = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=1000, n_positions=128, bos_token_id=0,
                                          eos_token_id=0))
    model = OutHeadsForCausalLM.from_backbone(backbone, head_type="drill", head_options={"depth": 2})
    card = str(model.create_model_card("someone/gpt2-drill")).strip()
    return f"````markdown\n{card}\n````\n"


TABLES = {"regimes": lambda: regime_table([RESULTS / folder for folder in REGIMES]), "heads": head_table,
          "regime_groups": regime_group_tables,
          "serving": serving_table, "example_card": example_card, "families": families_table, "unbuilt_families": unbuilt_families_table}


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
