"""The head-comparison harness (training/compare_heads.py) and the second real corpus
(training/manpages_corpus.py), in process."""

from __future__ import annotations

import gzip
import io
import json
import tarfile

import pytest
import yaml

from training import compare_heads
from training.manpages_corpus import PACKAGES, load_manpages_dataset, roff_to_text
from training.options import parse_options
from training.study_plots import plot_curves


def fake_run(name, seed, ppl, curve):
    return {"name": name, "head": name.split("-")[0], "head_options": {}, "seed": seed, "eval_perplexity": ppl,
            "parameters": 100, "head_parameters": 10, "train_step_time_s": 0.1 * (2 if name != "tied" else 1),
            "curve": [{"step": s, "train_seconds": s * 0.1, "eval_perplexity": p} for s, p in curve]}


RUNS = [fake_run("tied", 1, 49.0, [(10, 80.0), (20, 49.0)]), fake_run("tied", 2, 51.0, [(10, 82.0), (20, 51.0)]),
        fake_run("mos", 1, 44.0, [(10, 70.0), (20, 44.0)]), fake_run("mos", 2, 46.0, [(10, 72.0), (20, 46.0)]),
        {"name": "bad", "seed": 1, "error": "ValueError: x"}]


def test_summary_gives_mean_and_std_over_seeds_and_the_change_against_the_baseline():
    rows = {row["name"]: row for row in compare_heads.summarise(RUNS, "tied")}
    assert rows["tied"]["eval_perplexity"] == pytest.approx((50.0, 2**0.5))
    assert rows["mos"]["eval_perplexity_vs_tied"] == pytest.approx(45.0 / 50.0 - 1)
    table = compare_heads.markdown_table(list(rows.values()), "tied")
    assert "| mos | mos | 2 | 45.00 ± 1.41 | -10.0% | 100 | 10 | 0.200 | 2.00x |" in table
    assert "| bad | failed: ValueError: x |" in table
    curves = compare_heads.curve_table(RUNS)
    assert "| step | tied | mos |" in curves and "| 10 | 81.00 | 71.00 |" in curves


def test_plots_against_steps_and_training_seconds(tmp_path):
    pytest.importorskip("matplotlib")
    written = plot_curves(RUNS, tmp_path)
    assert [p.name for p in written] == ["curves.png", "walltime.png"] and all(p.stat().st_size > 1000 for p in written)


def test_variants_need_a_registered_head_type(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({"head_options_by_head": {"mos-paper": {"head_type": "mos", "tied": True},
                                                               "typo": {"num_components": 2}}}))
    options = parse_options(["--config", str(config)])
    head, spelt_out = compare_heads.run_specs(options, ["mos-paper"])["mos-paper"]
    assert head == "mos" and spelt_out["tied"] is True  # the given option, over every default spelt out
    assert spelt_out["latent_init"] == "identity" and spelt_out["num_components"] == 15
    with pytest.raises(SystemExit, match=r"\['typo'\] are not registered.*needs `head_type`"):
        compare_heads.run_specs(options, ["tied", "typo"])
    with pytest.raises(SystemExit, match=r"\['no_such_head'\] are not registered"):
        compare_heads.main(["--heads", "tied,no_such_head", "--output_dir", str(tmp_path / "out")])
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_a_finished_run_is_reused_and_a_changed_config_retrains(tmp_path, monkeypatch):
    options = parse_options(["--output_dir", str(tmp_path)])
    calls = []

    def train(*args, **kwargs):  # stands for the training subprocess: writes the results
        calls.append(args)
        (tmp_path / "tied" / "seed3" / "eval_results.json").write_text(json.dumps(RUNS[0]))
        return type("Done", (), {"returncode": 0})()

    monkeypatch.setattr(compare_heads.subprocess, "run", train)
    first = compare_heads.run_one(options, "tied", ("tied", {}), 3, "", 1)
    again = compare_heads.run_one(options, "tied", ("tied", {}), 3, "", 1)
    assert len(calls) == 1 and first["eval_perplexity"] == again["eval_perplexity"] == 49.0
    saved = tmp_path / "tied" / "seed3" / "train_config.yaml"  # the same options in another order
    saved.write_text(yaml.safe_dump(dict(reversed(yaml.safe_load(saved.read_text()).items())), sort_keys=False))
    compare_heads.run_one(options, "tied", ("tied", {}), 3, "", 1)
    assert len(calls) == 1
    compare_heads.run_one(options, "tied", ("tied", {"training_loss": "chunked"}), 3, "", 1)
    assert len(calls) == 2


def test_head_learning_rate_applies_to_the_head_parameters_only():
    from hf_outheads import OutHeadsConfig, OutHeadsForCausalLM
    from tiny import tiny_config
    from training.train import make_optimizer

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
