"""The head comparison at GPT-2-small size, on one GPU, as a queue that goes on from call to call:
every head trains the same backbone on the same token budget and block order of the packed
corpus (`hf_outheads/training/corpora/debian_docs.py`) with `hf_outheads/training/train.py`, the loop every user runs,
called in this process (`run.train_in_process`): compiled (`torch_compile`), in bf16 with sdpa
attention, TF32 and fused AdamW, with no host read between logging steps. Recorded per run, from
train.py's results and metrics.jsonl: validation perplexity (during and after training), perplexity
by training-frequency band (`hf_outheads.training.frequency_bands`), training tokens/s, training FLOPs
(`hf_outheads.training.flops`), the achieved FLOP rate against the device's measured bf16 peak (MFU) and
the loss path the head trained with; after an `mtp` run, in the same call, its greedy drafting
against plain greedy (`drafting_speed`: `studies.mtp_speed`'s measurement on validation blocks,
token-identical or said to fail, into `speed.md` / `speed.json` and a line of the results).

    python -m studies.scale_heads --data data/scale_corpus --out OUTDIR --budget_s 300
    python -m studies.scale_heads --tabulate studies/results/scale_gpt2small/scale_runs.jsonl \\
        --out studies/results/scale_gpt2small        # the tables again, from the runs alone

The queue: the config's `queue` (run names in order) at the config's seed, then a second seed
for every run within `SECOND_SEED_WITHIN` of the best plain head (and for that head, so that
seeds pair). `--runs` (default: the committed `studies/results/scale_gpt2small/scale_runs.jsonl`)
holds the runs so far; the call copies them to `<out>/scale_runs.jsonl`, trains the next runs
that fit `--budget_s` (a run predicted, from the rates of the runs so far on this device, to end
past it is left for the next call; one that still would, after its first `CHECK_STEP` steps, is
given up: a callback of train.py's loop, `Budget`), appends each finished run at once, and writes
the tables of every run so far into `<out>`. Copying `<out>` over the committed folder records the
call. `--heads` trains the names given instead.

What the study adds to train.py is only this: the queue, the budget and the tables. A run's
options are the config's (`run_options`): the corpus as a pre-tokenised dataset (one row of ids a
block, `debian_docs.write_dataset`), the blocks in one seeded order for every head and seed
(`data_seed`: the config's seed), a cosine schedule to `min_lr_ratio` of the peak after
`warmup_fraction` of the steps, `evaluations` evaluations on the first `eval_blocks` validation
blocks. Head names and variants are resolved as in `studies/compare_heads.py` (a head type, or a
key of the config's `head_options_by_head` with `head_type`); the tables are its `write_results`
(first line: the command), plus speed and the comparison at equal wall time.
`--override KEY=VALUE` replaces a config value (YAML syntax), e.g. for the `--tiny` check.
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch
import yaml

from hf_outheads.training.options import RunOptions, head_spec
from hf_outheads.training.throughput import device_name, peak_tflops
from hf_outheads.training.run import COMPILE_STEPS

RUNS_FILE = "scale_runs.jsonl"
RESULTS = Path(__file__).parent / "results" / "scale_gpt2small"  # the committed runs: the queue's state
WARM_STEP, CHECK_STEP = COMPILE_STEPS, 15  # steps up to WARM_STEP compile (and may recompile): train.py times its
# rates after them; at CHECK_STEP a run's end is predicted again (--budget_s)
SECOND_SEED_WITHIN = 0.03  # a second seed for a run whose perplexity is within 3% of the best plain head's
# what a run's row keeps of train.py's results (the rest of the row: the study's names, settings and curve)
RESULT_FIELDS = ("eval_perplexity", "eval_tokens", "eval_bands", "parameters", "head_parameters", "train_tokens",
                 "train_seconds", "first_step_s", "warm_up_s", "warm_up_steps", "train_step_time_s", "tokens_per_s",
                 "train_flops_per_step", "train_flops", "achieved_tflops", "peak_tflops", "mfu", "loss_path", "device")


def run_options(cfg: dict, name: str, seed: int, corpus: Path, data_files: dict, output_dir: Path) -> RunOptions:
    """train.py's options of run `name` at `seed`: the config's GPT-2 shape (the `gpt2-small` preset with its
    layers, width and heads) and training settings, on the corpus's blocks (`corpus` holds its tokenizer,
    `data_files` its pre-tokenised splits); bf16 on a GPU; a logging step (a read of the device) every
    `WARM_STEP` steps, so that the steps up to `WARM_STEP` and `CHECK_STEP` are timed to the device."""
    block = json.loads((corpus / "corpus.json").read_text())["block_size"]
    batch = cfg["batch_size"]
    steps = max(1, cfg["train_tokens"] // (batch * block))
    beta1, beta2 = cfg["adam_betas"]
    return RunOptions.from_flat(dict(
        task="causal_lm", model_preset="gpt2-small",
        model_overrides={"n_layer": cfg["n_layer"], "n_embd": cfg["n_embd"], "n_head": cfg["n_head"], "n_positions": block},
        dropout=cfg["dropout"], head_type=name, head_options_by_head=cfg.get("head_options_by_head", {}),
        tokenizer=str(corpus), data_files=data_files, block_size=block, max_eval_samples=cfg.get("eval_blocks"),
        seed=seed, data_seed=cfg["seed"], per_device_train_batch_size=batch,
        per_device_eval_batch_size=cfg["eval_batch_size"], learning_rate=cfg["learning_rate"],
        weight_decay=cfg["weight_decay"], adam_beta1=beta1, adam_beta2=beta2, max_grad_norm=1.0,
        lr_scheduler_type="cosine_with_min_lr", lr_scheduler_kwargs={"min_lr_rate": cfg["min_lr_ratio"]},
        warmup_steps=round(cfg["warmup_fraction"] * steps), max_steps=steps,
        eval_steps=math.ceil(steps / cfg["evaluations"]), logging_steps=WARM_STEP,
        mixed_precision="bf16" if torch.cuda.is_available() else "no", torch_compile=bool(cfg.get("torch_compile")),
        sample_max_new_tokens=8, output_dir=str(output_dir), overwrite_output_dir=True, resume="never",
        report_to="none"))


def planned_model(options: RunOptions, tokenizer):
    """The run's model on the meta device (nothing allocated): its FLOPs and attention, before it trains."""
    from hf_outheads.training.modeling import build_model

    with torch.device("meta"):
        return build_model(options, tokenizer)


def predicted_seconds(flops: float, evaluations: int, eval_flops: float, runs: list[dict]) -> float | None:
    """Seconds a run of `flops` training FLOPs would take, from the slowest rate and the largest
    warm-up time (compilation) of `runs` (the runs so far on this kind of device); None without
    such runs."""
    if not runs:
        return None
    rate = min(run["achieved_tflops"] for run in runs) * 1e12
    overhead = max(run.get("warm_up_s", run["first_step_s"]) for run in runs)
    return overhead + flops / rate + evaluations * eval_flops / 3 / rate  # an evaluation: forwards only


class GivenUp(Exception):
    """A run that would end past the call's budget (`Budget`): left for the next call."""


class Budget:
    """A callback of train.py's loop (`loop.train_loop`): after `CHECK_STEP` steps (or the run's last, when
    it has fewer but more than `WARM_STEP`), the run's end is predicted from its steps after `WARM_STEP`
    (step times that include the waits for the device at the logging steps, `run_options`), its
    evaluations and the tables; past `deadline` (a `time.perf_counter()` value), the run is given up."""

    def __init__(self, deadline: float, steps: int, evaluations: int, eval_batches_per_batch: float):
        self.deadline, self.steps, self.evaluations = deadline, steps, evaluations
        self.eval_batches_per_batch = eval_batches_per_batch

    def __call__(self, progress, step_times: list[float]) -> None:
        check = min(CHECK_STEP, self.steps)
        if progress.step != check or check <= WARM_STEP:
            return
        step_s = sum(step_times[WARM_STEP:]) / (len(step_times) - WARM_STEP)
        evaluation_s = step_s * self.eval_batches_per_batch / 2  # a forward, no backward
        end = time.perf_counter() + step_s * (self.steps - check) * 1.03 + evaluation_s * self.evaluations + 15
        if end > self.deadline:
            raise GivenUp(f"given up after {check} steps: {step_s:.3f} s a step would end {end - self.deadline:.0f} s "
                          "past --budget_s")


def curve(metrics: list[dict]) -> list[dict]:
    """The run's evaluations (train.py's periodic ones and its final one) with the training loss last
    logged by then."""
    points, loss = [], None
    for record in metrics:
        loss = record.get("train_loss", loss)
        if "eval_perplexity" in record:
            points.append({"step": record["step"], "train_seconds": record["train_seconds"],
                           "train_flops": record["train_flops"], "eval_perplexity": record["eval_perplexity"],
                           "train_loss": loss})
    return points


def train_run(name: str, seed: int, cfg: dict, corpus: Path, data_files: dict, scratch: Path,
              deadline: float | None = None, earlier: list[dict] = ()) -> dict | None:
    """Train and evaluate one run with train.py; its row of `scale_runs.jsonl`, or None (with a line
    saying why) when it would end after `deadline`: predicted from `earlier` runs before it starts, and
    again after `CHECK_STEP` steps (`Budget`)."""
    from hf_outheads.training.modeling import step_flops
    from hf_outheads.training.preflight import check_run
    from hf_outheads.training.tokenization import load_pretrained_tokenizer
    from hf_outheads.training.tracking import read_metrics
    from hf_outheads.training.run import train_in_process
    from studies.provenance import produced_by

    output_dir = scratch / f"{name}-seed{seed}"
    options = run_options(cfg, name, seed, corpus, data_files, output_dir)
    check_run(options)
    training, spec = options.training, options.model.head
    model = planned_model(options, load_pretrained_tokenizer(str(corpus)))
    per_step, batch, steps = step_flops(model, options, 1), training.per_device_train_batch_size, training.max_steps
    validation = json.loads((corpus / "corpus.json").read_text())["splits"]["validation"]["blocks"]
    validation = min(validation, options.data.max_eval_samples or validation)
    evaluations = math.ceil(steps / training.eval_steps)
    predicted = predicted_seconds(per_step * steps, evaluations, per_step / batch * validation, earlier)
    if deadline is not None and predicted is not None and time.perf_counter() + predicted > deadline:
        print(f"=== {name} (seed {seed}): left for the next call: predicted {predicted:.0f} s, "
              f"{deadline - time.perf_counter():.0f} s left of --budget_s", flush=True)
        return None
    print(f"=== {name} (seed {seed}): {spec.options if spec.options is not None else spec.head_type}, {steps} steps of "
          f"{batch} x {options.data.block_size} tokens, {per_step * steps:.3g} FLOPs"
          + (f", predicted {predicted:.0f} s" if predicted is not None else ""), flush=True)
    callbacks = [] if deadline is None else [Budget(deadline, steps, evaluations, validation / batch)]
    try:
        results = train_in_process(options, callbacks)
    except GivenUp as error:
        print(f"=== {name} (seed {seed}): {error}", flush=True)
        return None
    row = {"name": name, "head": spec.head_type, "head_options": spec.spelt_out(), "seed": seed,
           **{key: results[key] for key in RESULT_FIELDS}, "train_steps": steps,
           "attn_implementation": model.config.text_config._attn_implementation,
           "torch_compile": training.torch_compile, "torch": torch.__version__,
           "dtype": "bf16 autocast" if training.mixed_precision == "bf16" else "fp32",
           "model": {key: cfg[key] for key in ("n_layer", "n_embd", "n_head")}, "curve": curve(read_metrics(output_dir)),
           "produced_by": produced_by()}
    if spec.head_type == "mtp":  # its model is on disk until the folder goes: its drafting speed now
        row["drafting"] = drafting_speed(output_dir, f"{name}/seed{seed}", cfg["drafting"], corpus, deadline)
    shutil.rmtree(output_dir)
    print(f"=== {name} (seed {seed}): val. perplexity {row['eval_perplexity']:.2f}, {row['tokens_per_s']:,.0f} tokens/s, "
          f"{row['train_seconds']:.0f} s of training, loss: {row['loss_path']}", flush=True)
    return row


def drafting_speed(model_dir: Path, label: str, settings: dict, corpus: Path, deadline: float | None) -> dict:
    """Greedy drafting against plain greedy (`studies.mtp_speed.measure_model`) of the `mtp` model saved in
    `model_dir`, on the corpus's first `settings["prompts"]` validation blocks: each block's first `prompt_tokens`
    as a prompt, its first `prompt_tokens + new_tokens` for the agreement on the text. Predicted first from a
    timed plain generation (the measurement's calls, a drafted one counted as two plain ones); when it would
    end after `deadline`, `{"skipped": why}` (and a line saying so)."""
    from transformers import AutoModelForCausalLM

    from hf_outheads.training.corpora.debian_docs import load_blocks
    from hf_outheads.training.tokenization import load_pretrained_tokenizer
    from studies import mtp_speed

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False  # a draft is checked against greedy's argmax: no near-tie flips
    try:
        model = AutoModelForCausalLM.from_pretrained(model_dir).to(device).eval()
        pad = load_pretrained_tokenizer(str(corpus)).pad_token_id
        length, count = settings["prompt_tokens"] + settings["new_tokens"], settings["prompts"]
        texts = [torch.tensor(block[None, :length].astype("int64"), device=device)
                 for block in load_blocks(corpus, "validation")[:count]]
        chosen = [text[:, : settings["prompt_tokens"]] for text in texts]
        options = dict(max_new_tokens=settings["new_tokens"], do_sample=False, pad_token_id=pad)
        mtp_speed.timed(model, chosen[0], **options)  # the first call warms the device up
        seconds, _ = mtp_speed.timed(model, chosen[0], **options)
        variants = 1 + (model.head.draft_tokens is not None)
        predicted = seconds * (1 + 2 * variants) * (settings["repeats"] * len(chosen) + 2) * 1.1
        left = None if deadline is None else deadline - time.perf_counter()
        if left is not None and predicted > left:
            why = f"drafting speed not measured: predicted {predicted:.0f} s, {left:.0f} s left of --budget_s"
            print(f"=== {label}: {why}", flush=True)
            return {"skipped": why}
        results = mtp_speed.measure_model(model, pad, chosen, texts, settings["new_tokens"], settings["repeats"], label)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
    machine = mtp_speed.machine_of(device.type, torch.get_num_threads())
    for result in results:
        result["device"] = device_name(device)
        print(f"=== {label}: greedy drafting ({result['draft_vocabulary']}) {result['speed_up']:.2f}x plain greedy, "
              + ("token-identical" if result["token_identical"] else "NOT token-identical")
              + ", acceptance " + ", ".join(f"{a:.0%}" for a in result["acceptance"] if a is not None), flush=True)
    return {"settings": settings, "machine": machine, "results": results}


def drafting_lines(runs: list[dict]) -> list[str]:
    """A line per `mtp` run: its greedy drafting against plain greedy (`drafting_speed`), or why it is missing."""
    lines = []
    for run in runs:
        drafting = run.get("drafting")
        if drafting is None:
            continue
        label = f"{run['name']} (seed {run['seed']})"
        if "skipped" in drafting:
            lines.append(f"- {label}: {drafting['skipped']}.")
        for r in drafting.get("results", []):
            acceptance = ", ".join(f"t+{j + 2} {a:.1%}" for j, a in enumerate(r["acceptance"]) if a is not None)
            lines.append(f"- {label}, {r['device']}, drafts from {r['draft_vocabulary']}: "
                         + (f"{r['speed_up']:.2f}x plain greedy ({r['tokens_per_s']['mtp']:,.1f} against "
                            f"{r['tokens_per_s']['plain']:,.1f} tokens/s), token-identical, acceptance {acceptance}"
                            if r["token_identical"] else "FAILED: drafted greedy differs from plain greedy") + ".")
    return lines


def write_drafting(runs: list[dict], out: Path) -> str:
    """`speed.md` / `speed.json` (`mtp_speed.write`) of the runs' drafting measurements, and results.md's lines."""
    from studies import mtp_speed

    lines = drafting_lines(runs)
    if not lines:
        return ""
    measured = [run for run in runs if run.get("drafting", {}).get("results")]
    if measured:
        last = measured[-1]["drafting"]
        command = " && ".join(dict.fromkeys(run["command"] for run in measured))
        mtp_speed.write([r for run in measured for r in run["drafting"]["results"]], out, command, last["settings"],
                        last["machine"], prompts_from="the scale corpus's first validation blocks")
    return ("Greedy drafting with the future predictors against plain greedy, after the run in the same call "
            "(studies/mtp_speed.py; speed.md):\n\n" + "\n".join(lines) + "\n")


def read_runs(paths) -> list[dict]:
    runs = []
    for path in map(Path, paths):
        if path.exists():
            runs += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return runs


def latest_runs(runs: list[dict]) -> list[dict]:
    """The latest run of each (name, seed)."""
    return list({(run["name"], run["seed"]): run for run in runs}.values())


def queue(cfg: dict, runs: list[dict], second_seeds: bool = True) -> list[tuple[str, int]]:
    """The (name, seed) runs still to train: the config's `queue` at its seed, then (`second_seeds`),
    once all of those are done, the second seed of every run within `SECOND_SEED_WITHIN` of the
    best plain head, and of that head."""
    done = {(run["name"], run["seed"]) for run in runs}
    first = [(name, cfg["seed"]) for name in cfg["queue"]]
    if not second_seeds or not all(item in done for item in first):
        return [item for item in first if item not in done]
    by_name = {run["name"]: run for run in runs if run["seed"] == cfg["seed"]}
    plain = [by_name[n] for n in ("tied", "linear") if n in by_name]
    if not plain:
        return []
    best = min(plain, key=lambda run: run["eval_perplexity"])
    close = [name for name, run in by_name.items()
             if run["eval_perplexity"] <= best["eval_perplexity"] * (1 + SECOND_SEED_WITHIN) and name != best["name"]]
    second = [(name, cfg["seed"] + 1) for name in ([best["name"]] + close) if name in cfg["queue"]] if close else []
    return [item for item in second if item not in done]


def speed_table(runs: list[dict]) -> str:
    lines = ["| run | seed | val. ppl | rare | medium | frequent | tokens/s | TFLOP/s | MFU (measured peak) | loss path | device |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for run in runs:
        bands = " | ".join(f"{run['eval_bands'][b]['perplexity'] or float('nan'):.1f}" for b in ("rare", "medium", "frequent"))
        mfu = f"{run['mfu']:.1%} of {run['peak_tflops']:.0f}" if run.get("mfu") else "-"
        lines.append(f"| {run['name']} | {run['seed']} | {run['eval_perplexity']:.2f} | {bands} | {run['tokens_per_s']:,.0f} | "
                     f"{run['achieved_tflops']:.1f} | {mfu} | {run.get('loss_path', '-')} | {run['device']} |")
    return "\n".join(lines)


def equal_time_table(runs: list[dict], best: str | None) -> str:
    """Each run's validation perplexity at the shortest training time of any run, against the best
    plain head's: a run's time at step k is k steady steps (`train_step_time_s`; compilation, which
    a later run of a call mostly finds cached, left out), its curve interpolated there
    (`comparison_tables.at_flops` on that time)."""
    from studies.comparison_tables import at_flops

    if best is None:
        return ""
    timed = [dict(run, curve=[dict(point, steady_seconds=point["step"] * run["train_step_time_s"])
                              for point in run["curve"]]) for run in runs]
    budget = min(run["train_steps"] * run["train_step_time_s"] for run in runs)
    at = {}
    for run in timed:
        value = at_flops(run, "eval_perplexity", budget, key="steady_seconds")
        if value is not None:
            at.setdefault(run["name"], []).append(value)
    if best not in at:
        return ""
    base = sum(at[best]) / len(at[best])
    lines = [f"Equal wall time: each run's curve interpolated at {budget:.0f} s of training at its steady step time, "
             "the shortest run's (a run whose first evaluation came later has no value).", "",
             "| run | val. perplexity at equal time | vs best plain at equal time |", "| --- | --- | --- |"]
    for name in dict.fromkeys(run["name"] for run in runs):
        if name in at:
            value = sum(at[name]) / len(at[name])
            lines.append(f"| {name} | {value:.2f} | {100 * (value / base - 1):+.1f}% |")
    return "\n".join(lines)


def tabulate(paths, out: Path, command: str) -> None:
    from studies.compare_heads import write_results

    runs = latest_runs(read_runs(paths))
    if not runs:
        raise SystemExit(f"No runs in {[str(p) for p in paths]}.")
    out.mkdir(parents=True, exist_ok=True)
    trained_by = " && ".join(dict.fromkeys(run["command"] for run in runs))
    rows = write_results(out, f"{trained_by} && {command}", sorted({run["seed"] for run in runs}), runs, plot=False)
    best = next((row["name"] for row in rows if row.get("eval_perplexity_vs_best_plain") == 0.0
                 and row.get("head") in ("tied", "linear")), None)
    text = (f"\nSpeed (training steps after the first {WARM_STEP}, which compile, evaluation excluded):\n\n" + speed_table(runs) + "\n\n"
            + equal_time_table(runs, best) + "\n")
    drafting = write_drafting(runs, out)
    text += "\n" + drafting if drafting else ""
    with (out / "results.md").open("a") as results:
        results.write(text)
    print(text)


def portable(arg: str) -> str:
    """A command-line argument as recorded in the results: an absolute path relative to the current
    folder when inside it, else `OUT` (no machine's paths in committed files)."""
    if not arg.startswith("/"):
        return arg
    try:
        return str(Path(arg).relative_to(Path.cwd()))
    except ValueError:
        return "OUT"


def check_drafting(drafting: dict | None, block: int, parser, config: Path) -> None:
    """The config's `drafting` settings name every field and fit a validation block; else a parser error."""
    fields = ("prompts", "prompt_tokens", "new_tokens", "repeats")
    if not isinstance(drafting, dict) or set(drafting) != set(fields):
        parser.error(f"drafting: {drafting!r} in {config}: give {{{', '.join(f'{f}: N' for f in fields)}}} "
                     "(the mtp run's drafting speed is measured with them)")
    if drafting["prompt_tokens"] + drafting["new_tokens"] > block:
        parser.error(f"drafting: prompt_tokens + new_tokens ({drafting['prompt_tokens']} + {drafting['new_tokens']}) "
                     f"exceeds the corpus's block size ({block}): lower them in {config} or with --override")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, default=Path(__file__).parent / "configs" / "scale_gpt2small.yaml")
    parser.add_argument("--data", type=Path, help="folder of the packed corpus (hf_outheads/training/corpora/debian_docs.py)")
    parser.add_argument("--heads", help="comma-separated run names to train, in this order, at the config's seed "
                                        "(default: the queue, and its second seeds)")
    parser.add_argument("--runs", type=Path, default=RESULTS / RUNS_FILE,
                        help="the runs so far (default: the committed ones); copied into --out and extended there")
    parser.add_argument("--out", type=Path, required=True, help="folder of scale_runs.jsonl and the tables")
    parser.add_argument("--budget_s", type=float, help="leave runs predicted to end after this many seconds")
    parser.add_argument("--override", action="append", default=[], metavar="KEY=VALUE", help="replace a config value")
    parser.add_argument("--tabulate", nargs="+", type=Path, metavar="RUNS_JSONL", help="only tabulate these runs")
    args = parser.parse_args(argv)
    command = "python -m studies.scale_heads " + shlex.join(map(portable, sys.argv[1:] if argv is None else argv))
    if args.tabulate:
        return tabulate(args.tabulate, args.out, command)
    if args.data is None:
        parser.error("--data is needed to train")
    cfg = yaml.safe_load(args.config.read_text())
    for item in args.override:
        key, sep, value = item.partition("=")
        if not sep or key not in cfg:
            parser.error(f"--override {item!r}: use KEY=VALUE with a key of {args.config} ({sorted(cfg)})")
        cfg[key] = yaml.safe_load(value)
    if args.heads:
        cfg["queue"] = [n.strip() for n in args.heads.split(",") if n.strip()]
    # an unknown head or a wrong option fails before training
    heads = [head_spec(name, cfg.get("head_options_by_head", {})).head_type for name in cfg["queue"]]
    if "mtp" in heads:  # its drafting speed is measured after it (`drafting_speed`): settings that fit the blocks
        check_drafting(cfg.get("drafting"), json.loads((args.data / "corpus.json").read_text())["block_size"],
                       parser, args.config)
    started = time.perf_counter()
    args.out.mkdir(parents=True, exist_ok=True)
    runs_file = args.out / RUNS_FILE
    runs = read_runs([args.runs]) if args.runs.resolve() != runs_file.resolve() else []
    if runs or not runs_file.exists():
        runs_file.write_text("".join(json.dumps(run) + "\n" for run in runs))
    runs = latest_runs(read_runs([runs_file]))
    second_seeds = not args.heads  # --heads: those runs only
    todo = queue(cfg, runs, second_seeds)
    if not todo:
        print(f"=== nothing left in the queue: every run is in {runs_file}", flush=True)
        return tabulate([runs_file], args.out, command)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # (what train.py's accelerate picks)
    peak, name_of_device = peak_tflops(device.type), device_name(device)
    print(f"=== {name_of_device}" + (f": dense bf16 peak measured {peak:.0f} TFLOP/s" if peak else "")
          + f"; queue: {', '.join(f'{n} (seed {s})' for n, s in todo)}", flush=True)
    from hf_outheads.training.corpora.debian_docs import write_dataset

    deadline = None if args.budget_s is None else started + args.budget_s
    left = set()  # runs left for the next call
    with tempfile.TemporaryDirectory(prefix="scale_heads-") as scratch:
        data_files = write_dataset(args.data, Path(scratch) / "corpus")
        while todo:
            name, seed = todo.pop(0)
            earlier = [run for run in runs if run["device"] == name_of_device]
            run = train_run(name, seed, cfg, args.data, data_files, Path(scratch), deadline, earlier)
            if run is None:
                left.add((name, seed))
            else:
                run["command"] = command
                with runs_file.open("a") as out:
                    out.write(json.dumps(run) + "\n")
                runs.append(run)
            if not todo:  # the second seeds, once every first run is done
                todo = [item for item in queue(cfg, runs, second_seeds) if item not in left]
    tabulate([runs_file], args.out, command)


if __name__ == "__main__":
    main()
