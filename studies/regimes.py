"""One table over several head comparisons (`compare_heads.py` output folders): for every head,
its change against the best plain head of each comparison at equal steps (with the seeds at which
it was better), at equal training FLOPs, and on the rare-word band.

    python -m studies.regimes                                  # the regimes (`REGIMES`)
    python -m studies.regimes studies/results/compare_stdlib_lm studies/results/compare_finetune_stdlib ...

It prints the table; the regimes' table in studies/results/regimes.md, and README.md's head
table built from the same results, are written by `python -m maintainer.doc_tables`.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
# the comparisons of studies/results/regimes.md (folders of RESULTS), in its order, each with the
# setting the README's tables name it by (regimes.md's first table describes each in full)
REGIMES = {
    "regime_scratch": "from scratch, 2,000 words, width 128",
    "regime_rank": "from scratch, 16,000 words, width 64",
    "regime_finetune": "a pretrained model converted, fine-tuned on new text",
    "regime_heldout": "from scratch on new text, a short run",
    "regime_scarce": "little data, many epochs",
    "regime_restore_scratch": "seq2seq from scratch, little data",
    "regime_restore_finetune": "seq2seq, a pretrained model converted, fine-tuned",
    "scale_gpt2small": "GPT-2 small, one GPU",
    "mtp_finetune": "converted, fine-tuned with multi-token prediction",
    "mtp_finetune_6l": "6 layers, converted, fine-tuned with multi-token prediction",
}


def cell(row: dict, metric: str) -> str:
    if f"{metric}_vs_best_plain" not in row:
        return ""
    text = f"{100 * row[f'{metric}_vs_best_plain']:+.1f}%"
    if "seeds_better" in row:
        text += " ({}/{})".format(*row["seeds_better"])
    return text


def regime_table(folders: list[Path]) -> str:
    """Markdown: one column group per comparison, one row per run name."""
    results = [(folder, json.loads((folder / "results.json").read_text())) for folder in folders]
    names = list(dict.fromkeys(row["name"] for _, result in results for row in result["rows"]))
    header = ["head"]
    for folder, result in results:
        best = result.get("best_plain", "?")
        header += [f"{folder.name}: vs {best}, equal steps (seeds better)", "equal FLOPs", "rare words"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name in names:
        cells = [name]
        for _, result in results:
            row = next((r for r in result["rows"] if r["name"] == name), None)
            if row is None:
                cells += ["", "", ""]
                continue
            metric = "eval_perplexity" if "eval_perplexity" in row else "eval_sacrebleu"
            equal = row.get("equal_flops")
            rare = row.get("bands_vs_best_plain", {}).get("rare")
            cells += [cell(row, metric), f"{100 * equal['vs_best_plain']:+.1f}%" if equal else "",
                      f"{100 * rare:+.1f}%" if rare is not None else ""]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def retabulate(folder: Path) -> None:
    """Rewrite a comparison's results.md, results.json and plots from the runs in its results.json
    (after a change of the tables; nothing is trained)."""
    from studies.compare_heads import write_results

    saved = json.loads((folder / "results.json").read_text())
    write_results(folder, saved["command"], saved["seeds"], saved["runs"])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folders", nargs="*", type=Path, help="compare_heads.py output folders (with results.json); "
                        "default: the regimes (REGIMES)")
    parser.add_argument("--retabulate", action="store_true", help="First rewrite each folder's tables and plots "
                        "from its results.json with the current code.")
    args = parser.parse_args(argv)
    folders = args.folders or [RESULTS / folder for folder in REGIMES]
    if args.retabulate:
        for folder in folders:
            retabulate(folder)
    print(regime_table(folders))


if __name__ == "__main__":
    main()
