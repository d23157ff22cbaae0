"""The head-comparison harness (studies/compare_heads.py) and the second real corpus
(hf_outheads/training/corpora/manpages.py), in process."""

from __future__ import annotations

import gzip
import io
import json
import tarfile
from pathlib import Path

import pytest
import torch
import yaml

from hf_outheads.training.corpora.manpages import PACKAGES, load_manpages_dataset, roff_to_text
from hf_outheads.training.launching import with_launch_precision
from hf_outheads.training.options import parse_options, saved_options
from studies import compare_heads
from studies.provenance import produced_by
from studies.study_plots import plot_curves

ROOT = Path(__file__).resolve().parents[1]


def fake_run(name, seed, ppl, curve, flops_per_step=1e12, bands=None):
    return {"name": name, "head": name, "head_options": {}, "seed": seed, "eval_perplexity": ppl,
            "parameters": 100, "head_parameters": 10, "train_step_time_s": 0.1 * (2 if name != "tied" else 1),
            "train_flops": flops_per_step * curve[-1][0],
            **({"eval_bands": {b: {"perplexity": v} for b, v in bands.items()}} if bands else {}),
            "curve": [{"step": s, "train_seconds": s * 0.1, "train_flops": s * flops_per_step, "eval_perplexity": p}
                      for s, p in curve]}


BANDS = {"rare": 400.0, "medium": 100.0, "frequent": 20.0}
RUNS = [fake_run("tied", 1, 49.0, [(10, 80.0), (20, 49.0)], bands=BANDS),
        fake_run("tied", 2, 51.0, [(10, 82.0), (20, 51.0)], bands=BANDS),
        fake_run("linear", 1, 47.0, [(10, 75.0), (20, 47.0)], bands=BANDS),
        fake_run("linear", 2, 45.0, [(10, 73.0), (20, 45.0)], bands=BANDS),
        # twice the FLOPs per step: at linear's budget (20 steps' worth) it is at its step 10
        fake_run("mos", 1, 44.0, [(10, 70.0), (20, 44.0)], 2e12, bands={**BANDS, "rare": 300.0}),
        fake_run("mos", 2, 46.0, [(10, 72.0), (20, 46.0)], 2e12, bands={**BANDS, "rare": 300.0}),
        {"name": "bad", "seed": 1, "error": "ValueError: x"}]


def test_summary_compares_every_head_with_the_best_plain_head_paired_by_seed_and_at_equal_flops():
    rows, best = compare_heads.summarise(RUNS)
    rows = {row["name"]: row for row in rows}
    assert best == "linear"  # 46 against tied's 50
    assert rows["tied"]["eval_perplexity"] == pytest.approx((50.0, 2**0.5))
    assert rows["mos"]["eval_perplexity_vs_best_plain"] == pytest.approx(45.0 / 46.0 - 1)
    assert rows["mos"]["seeds_better"] == [1, 2]  # 44 < 47 at seed 1, 46 > 45 at seed 2
    assert rows["mos"]["equal_flops"]["budget"] == pytest.approx(20e12)
    assert rows["mos"]["equal_flops"]["value"] == pytest.approx(71.0)  # its step-10 evaluations
    assert rows["mos"]["equal_flops"]["vs_best_plain"] == pytest.approx(71.0 / 46.0 - 1)
    assert rows["mos"]["bands_vs_best_plain"]["rare"] == pytest.approx(-0.25)
    table = compare_heads.markdown_table(list(rows.values()), best)
    assert "| mos | mos | 2 | 45.00 ± 1.41 | -2.2% | 1/2 | 71.00 | +54.3% | 300.0 (-25.0%) |" in table
    assert "| bad | failed: ValueError: x |" in table
    curves = compare_heads.curve_table(RUNS)
    assert "| step | tied | linear | mos |" in curves and "| 10 | 81.00 | 74.00 | 71.00 |" in curves


def test_interpolation_between_evaluations_is_log_linear_in_perplexity():
    from studies.comparison_tables import at_flops

    run = fake_run("mos", 1, 25.0, [(10, 100.0), (20, 25.0)])
    assert at_flops(run, "eval_perplexity", 15e12) == pytest.approx(50.0)
    assert at_flops(run, "eval_perplexity", 30e12) is None


def test_plots_against_steps_training_seconds_and_flops(tmp_path):
    pytest.importorskip("matplotlib")
    written = plot_curves(RUNS, tmp_path)
    assert [p.name for p in written] == ["curves.png", "walltime.png", "flops.png"]
    assert all(p.stat().st_size > 1000 for p in written)


def test_variants_need_a_registered_head_type(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({"head_options_by_head": {"mos-paper": {"head_type": "mos", "tied": True},
                                                               "typo": {"num_components": 2}}}))
    options = parse_options(["--config", str(config)])
    head, spelt_out = compare_heads.run_specs(options, ["mos-paper"])["mos-paper"]
    assert head == "mos" and spelt_out["tied"] is True  # the given option, over every default spelt out
    assert spelt_out["latent_init"] == "identity" and spelt_out["num_components"] == 15
    with pytest.raises(SystemExit, match=r"\['typo'\] cannot be trained: Unknown head type 'typo'.*names its head with `head_type`"):
        compare_heads.run_specs(options, ["tied", "typo"])
    with pytest.raises(SystemExit, match=r"\['no_such_head'\] cannot be trained: Unknown head type"):
        compare_heads.main(["--heads", "tied,no_such_head", "--output_dir", str(tmp_path / "out")])
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_a_finished_run_is_reused_and_a_changed_config_retrains(tmp_path, monkeypatch):
    options = parse_options(["--output_dir", str(tmp_path)])
    calls = []

    def train(command, **kwargs):  # stands for the training subprocess: saves its options as train.py does, resolved
        calls.append(command)    # (mixed_precision: the launch's), and writes the results
        config = command[command.index("--config") + 1]
        resolved, _ = with_launch_precision(parse_options(["--config", config]))
        Path(config).write_text(yaml.safe_dump(saved_options(resolved), sort_keys=False))
        (tmp_path / "tied" / "seed3" / "eval_results.json").write_text(json.dumps(RUNS[0]))
        return type("Done", (), {"returncode": 0})()

    monkeypatch.setattr(compare_heads.subprocess, "run", train)
    first = compare_heads.run_one(options, "tied", ("tied", {}), 3, "", 1)
    again = compare_heads.run_one(options, "tied", ("tied", {}), 3, "", 1)
    assert len(calls) == 1 and first["eval_perplexity"] == again["eval_perplexity"] == 49.0
    # what trained it, recorded when it trained and kept when it is reused
    assert first["produced_by"] == again["produced_by"] == produced_by()
    assert first["produced_by"]["versions"]["torch"] == torch.__version__ and first["produced_by"]["commit"]
    saved = tmp_path / "tied" / "seed3" / "train_config.yaml"  # the same options in another order
    saved.write_text(yaml.safe_dump(dict(reversed(yaml.safe_load(saved.read_text()).items())), sort_keys=False))
    compare_heads.run_one(options, "tied", ("tied", {}), 3, "", 1)
    assert len(calls) == 1
    compare_heads.run_one(options, "tied", ("tied", {"training_loss": "chunked"}), 3, "", 1)
    assert len(calls) == 2


def test_head_learning_rate_applies_to_the_head_parameters_only():
    from hf_outheads import OutHeadsConfig, OutHeadsForCausalLM
    from tiny import tiny_config
    from hf_outheads.training.run import make_optimizer

    model = OutHeadsForCausalLM(OutHeadsConfig(text_config=tiny_config("gpt2"), head_type="bilinear"))
    options = parse_options(["--learning_rate", "1e-3", "--head_learning_rate", "1e-4"])
    groups = make_optimizer(model, options).param_groups
    head = {id(p) for p in model.head.parameters()}
    for group in groups:
        in_head = {id(p) in head for p in group["params"]}
        assert len(in_head) == 1 and group["lr"] == (1e-4 if in_head.pop() else 1e-3)
        assert group["weight_decay"] == (0.01 if group["params"][0].ndim >= 2 else 0.0)
    assert sum(len(g["params"]) for g in groups) == len(list(model.parameters()))
    embedding = model.output_embedding_matrix()
    assert any(p is embedding and g["lr"] == 1e-3 for g in groups for p in g["params"])


PAGE = r'''.\" comment
.TH OPEN 2 2023-02-05 "Linux man-pages 6.03"
.SH NAME
open \- open a file
.SH DESCRIPTION
The
.BR open ()
system call opens the file specified by
.IR pathname .
It returns \fBa file descriptor\fP \(em a small integer.
.PP
.nf
int fd = open(path, O_RDONLY);
.fi
'''


def test_roff_source_becomes_filled_plain_text():
    assert roff_to_text(PAGE) == ("Name\nopen - open a file\nDescription\nThe open() system call opens the file "
                                  "specified by pathname. It returns a file descriptor \u2014 a small integer.\n"
                                  "int fd = open(path, O_RDONLY);")


def fake_deb(pages: dict[str, str]) -> bytes:
    """A `.deb` (ar archive) whose data.tar.xz holds gzipped man pages."""
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w:xz") as archive:
        for path, text in pages.items():
            body = gzip.compress(text.encode())
            info = tarfile.TarInfo(path)
            info.size = len(body)
            archive.addfile(info, io.BytesIO(body))
    members = [("debian-binary", b"2.0\n"), ("data.tar.xz", data.getvalue())]
    out = b"!<arch>\n"
    for name, body in members:
        out += f"{name + '/':<16}{0:<12}{0:<6}{0:<6}{100644:<8}{len(body):<10}`\n".encode() + body + b"\n" * (len(body) % 2)
    return out


def test_manpages_dataset_from_cached_packages_splits_by_page(tmp_path):
    long_page = PAGE + "Filler text for the page.\n" * 20
    pages = {f"./usr/share/man/man2/call{i}.2.gz": long_page.replace("open", f"call{i}") for i in range(40)}
    pages["./usr/share/man/man2/alias.2.gz"] = ".so man2/call1.2\n"  # a link: skipped
    pages["./usr/share/doc/manpages/copyright"] = "not a page"
    for package in PACKAGES:
        (tmp_path / f"{package}_1.0_all.deb").write_bytes(fake_deb(pages if package == "manpages" else {}))
    data = load_manpages_dataset(validation_percent=20, cache=tmp_path)
    names = [t.split("\n")[0] for split in data.values() for t in split["text"]]
    assert sorted(names) == sorted(f"call{i}(2)" for i in range(40))
    assert 0 < len(data["validation"]) < len(data["train"])
    assert "The call3() system call" in next(t for split in data.values() for t in split["text"]
                                            if t.startswith("call3(2)"))


def test_regime_table_puts_each_comparison_beside_the_others(tmp_path):
    from studies.regimes import regime_table

    rows, best = compare_heads.summarise(RUNS)
    for name in ("scratch", "finetune"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "results.json").write_text(json.dumps({"best_plain": best, "rows": rows}))
    table = regime_table([tmp_path / "scratch", tmp_path / "finetune"])
    assert "scratch: vs linear, equal steps (seeds better)" in table
    assert "| mos | -2.2% (1/2) | +54.3% | -25.0% | -2.2% (1/2) | +54.3% | -25.0% |" in table


def test_retabulate_rewrites_the_tables_from_the_saved_runs(tmp_path):
    from studies.regimes import retabulate

    (tmp_path / "results.json").write_text(json.dumps({"command": "python x", "seeds": [1, 2], "runs": RUNS}))
    retabulate(tmp_path)
    assert "| mos | mos | 2 | 45.00 ± 1.41 | -2.2% | 1/2 |" in (tmp_path / "results.md").read_text()
    assert json.loads((tmp_path / "results.json").read_text())["best_plain"] == "linear"


# the committed comparisons whose runs were trained before the studies recorded what trained each run
# (`provenance.produced_by`); a comparison trained again leaves this list
TRAINED_BEFORE_PROVENANCE = {
    "ablation_restore_linear_head_lr_1e-2",
    "ablation_restore_linear_head_lr_4e-4", "ablation_stdlib_map_scale", "ablation_stdlib_warmup100",
    "compare_manpages_lm", "compare_manpages_lm_bilinear",
    "compare_manpages_lm_lightrnn", "compare_manpages_lm_warmup30", "compare_stdlib_lm", "compare_stdlib_lm_6seeds",
    "compare_stdlib_lm_6seeds_warmup30", "compare_stdlib_lm_warmup30", "regime_heldout", "regime_rank",
    "regime_rank_linear_at_lightrnn_flops", "regime_restore_scratch",
    "regime_restore_scratch_mos_tied", "regime_scarce", "regime_scratch", "scale_gpt2small"}


def test_every_committed_result_names_its_command_and_what_trained_its_runs():
    """Each committed results.json names its command, and each of its runs the commit and the package versions
    that trained it, but for the comparisons listed as trained before runs recorded them (and only those: one
    trained again must leave the list)."""
    lacking = set()
    for path in sorted((ROOT / "studies" / "results").glob("*/results.json")):
        saved = json.loads(path.read_text())
        assert saved.get("command", "").startswith("python"), path
        runs = [run for run in saved["runs"] if "error" not in run]
        if any("produced_by" not in run for run in runs):
            lacking.add(path.parent.name)
        for run in runs:
            if "produced_by" in run:
                assert run["produced_by"]["commit"] and run["produced_by"]["versions"]["torch"], (path, run["name"])
    assert lacking == TRAINED_BEFORE_PROVENANCE


def test_runs_are_added_to_a_written_comparison_without_training_the_others(tmp_path, monkeypatch):
    """`--add_to`: only the given heads train, at the comparison's seeds; its other runs are kept as they
    were, a rerun head's old runs replaced, and the merged tables written into its folder."""
    folder = tmp_path / "regime"
    folder.mkdir()
    (folder / "results.json").write_text(json.dumps({"command": "python -m studies.compare_heads --heads tied,linear,mos",
                                                     "seeds": [1, 2], "runs": RUNS[:6]}))
    trained = []

    def run_one(options, name, spec, seed, launch_args, threads):
        trained.append((name, seed))
        return fake_run(name, seed, 40.0 + seed, [(10, 70.0), (20, 40.0 + seed)])

    monkeypatch.setattr(compare_heads, "run_one", run_one)
    argv = ["--heads", "linear", "--add_to", str(folder), "--output_dir", str(tmp_path / "out"), "--no_plot"]
    compare_heads.main(argv)
    assert trained == [("linear", 1), ("linear", 2)]
    saved = json.loads((folder / "results.json").read_text())
    assert sorted((r["name"], r["seed"]) for r in saved["runs"]) == [(n, s) for n in ("linear", "mos", "tied") for s in (1, 2)]
    assert [r["eval_perplexity"] for r in saved["runs"] if r["name"] == "linear"] == [41.0, 42.0]
    assert saved["runs"][:2] == RUNS[:2] and saved["command"].endswith("; then python -m studies.compare_heads "
                                                                       + " ".join(argv))
    assert "| linear | linear | 2 | 41.50 ± 0.71 |" in (folder / "results.md").read_text()
    with pytest.raises(SystemExit, match=r"its runs are at seeds \[1, 2\], not \[3\]"):
        compare_heads.main(argv + ["--seeds", "3"])
    written = (folder / "results.json").read_text()
    monkeypatch.setattr(compare_heads, "run_one", lambda options, name, spec, seed, *rest: {
        "name": name, "seed": seed, "error": "FileNotFoundError: no data"})
    with pytest.raises(SystemExit, match="left as it was, since linear seed 1, linear seed 2 failed"):
        compare_heads.main(argv)
    assert (folder / "results.json").read_text() == written
