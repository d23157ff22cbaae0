"""Self-speculative decoding with the `mtp` head, measured: greedy tokens/s of
`generate(use_mtp=True)` against plain greedy `generate()` of the same model, and the acceptance
rate per future position.

    python -m studies.mtp_speed outputs/mtp_finetune --output_dir studies/results/mtp_finetune

Reads every `<runs>/<name>/seed<seed>/` run of a comparison (`studies.compare_heads`) whose model has
an `mtp` head, and the prompts from the built-in corpus's validation split (its first documents with
at least `--prompt_tokens` tokens, cut there). Paired, in one process: for each prompt the two
methods run alternately `--repeats` times, so that load from other processes on the machine falls on
both alike; a prompt's time is the median of its repeats; tokens/s is a method's generated tokens over
the sum of its prompts' times. Every drafted generation must be token-identical to the plain one (the
script stops otherwise). Writes `speed.md` and `speed.json` to `--output_dir`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import torch

DRAFT_CHECK = "identical tokens"


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", help="A compare_heads output folder (<name>/seed<seed>/ runs).")
    parser.add_argument("--output_dir", required=True, help="Where speed.md and speed.json go.")
    parser.add_argument("--prompts", type=int, default=16, help="Prompts from the validation split.")
    parser.add_argument("--prompt_tokens", type=int, default=32, help="Tokens per prompt.")
    parser.add_argument("--new_tokens", type=int, default=64, help="max_new_tokens of each generation.")
    parser.add_argument("--repeats", type=int, default=5, help="Alternating calls per method and prompt.")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (CPU).")
    parser.add_argument("--device", default="cpu", help="cpu or cuda.")
    parser.add_argument("--command", default=None, help="The command line to record (default: this one).")
    return parser.parse_args(argv)


def mtp_runs(root: Path) -> list[Path]:
    """Run folders under `root` whose saved model has an `mtp` head."""
    found = []
    for config in sorted(root.glob("*/seed*/config.json")):
        if json.loads(config.read_text()).get("head_type") == "mtp":
            found.append(config.parent)
    return found


def prompts(tokenizer, count: int, length: int) -> list[torch.Tensor]:
    """`(1, length)` prompts: the first tokens of the built-in corpus's validation texts (`leading_tokens`)."""
    from hf_outheads.training.mtp_distill import leading_tokens
    from hf_outheads.training.corpora.stdlib import load_stdlib_dataset

    texts = (row["text"] for row in load_stdlib_dataset("text")["validation"])
    return [torch.tensor([ids]) for ids in leading_tokens(texts, tokenizer, count, length)]


def repeated_share(sequences: list[torch.Tensor], prompt_tokens: int, n: int = 4) -> float:
    """The share of generated tokens (after `prompt_tokens`) that end an `n`-gram already in their sequence."""
    repeated = total = 0
    for sequence in sequences:
        ids = sequence.reshape(-1).tolist()
        seen = {tuple(ids[i - n + 1 : i + 1]) for i in range(n - 1, prompt_tokens)}
        for i in range(max(prompt_tokens, n - 1), len(ids)):
            gram = tuple(ids[i - n + 1 : i + 1])
            repeated, total = repeated + (gram in seen), total + 1
            seen.add(gram)
    return repeated / max(total, 1)


def timed(model, prompt, **options) -> tuple[float, torch.Tensor]:
    return timed_call(lambda: model.generate(prompt, **options), prompt.device)


@torch.no_grad()
def forward_costs(model, prompt, sizes, repeats: int) -> dict[int, float]:
    """Median seconds of one forward over `n` new tokens after the prompt's KV cache, for each `n` of
    `sizes` (1: a plain greedy step; D + 1: a verification of D drafts), measured alternately."""
    from transformers import DynamicCache

    times = {n: [] for n in sizes}
    for _ in range(repeats):
        for n in sizes:
            cache = DynamicCache(config=model.config.get_text_config())
            model(prompt, cache=cache, use_cache=True)
            new = prompt[:, -n:]
            seconds, _ = timed_call(lambda: model(new, cache=cache, use_cache=True, logits_to_keep=n), prompt.device)
            times[n].append(seconds)
    return {n: statistics.median(values) for n, values in times.items()}


def timed_call(fn, device) -> tuple[float, object]:
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    out = fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start, out


@torch.no_grad()
def text_agreement(model, texts: list[torch.Tensor]) -> list[float]:
    """Per depth k, the share of positions t of the corpus's own texts where depth k's argmax (token
    t + k + 1, every token ahead the text's own: teacher-forced) is the next-token head's argmax for
    the same token (at position t + k): the acceptance drafting would see on such text."""
    from hf_outheads import HeadInputs

    head, embeddings = model.head, model.output_embedding_matrix()
    agree, total = [0] * len(head.predictors), [0] * len(head.predictors)
    for ids in texts:
        hidden = model.backbone(input_ids=ids).last_hidden_state * model.config.hidden_scale
        main = head.shared(HeadInputs(hidden, embeddings)).logits.argmax(-1)
        tokens = torch.cat([ids[:, 1:], ids.new_full((ids.shape[0], 1), -100)], dim=1)
        for k, state in head.future_states(hidden, embeddings, tokens):
            drafts = head.shared(HeadInputs(head.predictors[k - 1].norm(state), embeddings)).logits.argmax(-1)
            positions = ids.shape[1] - k - 1
            if positions > 0:
                agree[k - 1] += int((drafts[:, :positions] == main[:, k : k + positions]).sum())
                total[k - 1] += positions * ids.shape[0]
    return [a / t if t else None for a, t in zip(agree, total)]


def measure(run: Path, args) -> list[dict]:
    """One saved model (`run`): `measure_model` on the built-in corpus's validation prompts."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import hf_outheads.configuration_outheads  # noqa: F401  (registers the package's classes with the Auto classes)

    tokenizer = AutoTokenizer.from_pretrained(run)
    model = AutoModelForCausalLM.from_pretrained(run).to(args.device).eval()
    chosen = [p.to(args.device) for p in prompts(tokenizer, args.prompts, args.prompt_tokens)]
    texts = [p.to(args.device) for p in prompts(tokenizer, args.prompts, args.prompt_tokens + args.new_tokens)]
    return measure_model(model, tokenizer.pad_token_id, chosen, texts, args.new_tokens, args.repeats, str(run))


def measure_model(model, pad_token_id, chosen: list[torch.Tensor], texts: list[torch.Tensor], new_tokens: int,
                  repeats: int, run: str) -> list[dict]:
    """An `mtp` model in eval mode: per-method greedy tokens/s over the `(1, P)` prompts `chosen` (paired,
    alternating `repeats` times), the ratio, the drafts' acceptance, and their agreement on `texts` (the
    prompts' texts, prompt and new-token lengths; `text_agreement`); one result per draft vocabulary: the
    model's own (`draft_vocab_size`), and every word. `token_identical` says whether every drafted generation
    was plain greedy's."""
    from hf_outheads.mtp_drafting import DraftCounts

    options = dict(max_new_tokens=new_tokens, do_sample=False, pad_token_id=pad_token_id)
    head = model.head
    shortlist = head.draft_tokens
    variants = {"every word": None}  # draft vocabulary -> the `draft_tokens` drafting uses
    if shortlist is not None:
        variants = {f"{shortlist.numel():,} most frequent": shortlist, **variants}

    def drafting(rows, prompt):
        head.draft_tokens = rows  # the draft vocabulary only changes drafting (not training, not the output)
        return timed(model, prompt, use_mtp=True, **options)

    counts = {name: DraftCounts.empty(len(head.predictors)) for name in variants}
    times = {name: [] for name in ("plain", *variants)}
    identical = dict.fromkeys(variants, True)
    tokens, outputs = 0, []
    for prompt in chosen[:2]:  # warm-up, not timed
        model.generate(prompt, **options)
        for rows in variants.values():
            drafting(rows, prompt)
    for prompt in chosen:
        per = {name: [] for name in times}
        for repeat in range(repeats):
            seconds, plain = timed(model, prompt, **options)
            per["plain"].append(seconds)
            for name, rows in variants.items():
                seconds, drafted = drafting(rows, prompt)
                per[name].append(seconds)
                identical[name] &= torch.equal(plain, drafted)
                if repeat == 0:
                    counts[name].add(head.draft_counts)
        tokens += plain.shape[1] - prompt.shape[1]
        outputs.append(plain)
        for name in per:
            times[name].append(statistics.median(per[name]))
    head.draft_tokens = shortlist
    speed = {name: tokens / sum(seconds) for name, seconds in times.items()}
    depth = len(head.predictors)
    costs = forward_costs(model, chosen[0], (1, depth + 1), repeats)
    agreement = text_agreement(model, texts)
    results = []
    for name in variants:
        count = counts[name]
        per_round = count.tokens / max(count.rounds, 1)
        results.append({
            "run": run, "head_options": model.config.head_options, "draft_vocabulary": name,
            "token_identical": identical[name], "prompts": len(chosen), "tokens": tokens,
            "tokens_per_s": {"plain": speed["plain"], "mtp": speed[name]}, "speed_up": speed[name] / speed["plain"],
            "acceptance": count.acceptance(), "tokens_per_round": per_round, "draft_counts": vars(count),
            "text_agreement": agreement, "repeated_4grams": repeated_share(outputs, chosen[0].shape[1]),
            # a round's cost in plain greedy steps: what the drafts must pay for
            "round_in_steps": speed["plain"] * per_round / speed[name],
            "verify_forward_in_steps": costs[depth + 1] / costs[1]})
    return results


def machine_of(device: str, threads: int) -> dict:
    """Where the timings ran: the device (a GPU's name), torch's threads, the processor and torch."""
    machine = {"device": device, "torch_threads": threads, "cpu_count": os.cpu_count(),
               "processor": platform.processor() or platform.machine(), "torch": torch.__version__}
    if device == "cuda":
        machine["gpu"] = torch.cuda.get_device_name()
    return machine


def write(results: list[dict], out: Path, command: str, settings: dict, machine: dict,
          prompts_from: str = "the built-in corpus's validation split") -> None:
    """`speed.json` and `speed.md` in `out`: `results` (`measure_model`'s) measured with `settings` (prompts,
    prompt_tokens, new_tokens, repeats) on `machine` (`machine_of`), the prompts taken from `prompts_from`."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "speed.json").write_text(json.dumps({"command": command, "machine": machine, "settings": settings,
                                                "runs": results}, indent=1) + "\n")
    depth = max(len(r["acceptance"]) for r in results)
    header = ["run", "device", "draft vocabulary", "plain tokens/s", "mtp tokens/s", "speed-up", "tokens per verification",
              "round / plain step", "verification forward / one-token forward"] + [
        f"acceptance t+{j + 2}" for j in range(depth)] + [f"agreement on the text, t+{j + 2}" for j in range(depth)] + [
        "greedy tokens repeating a 4-gram"]
    lines = [f"Command: `{command}`", "",
             f"Greedy decoding, {settings['prompts']} prompts of {settings['prompt_tokens']} tokens from {prompts_from}, "
             f"up to {settings['new_tokens']} new tokens, {settings['repeats']} alternating calls per method and prompt "
             f"(median), {machine.get('gpu', machine['device'])} ({machine['processor']}, {machine['torch_threads']} "
             f"torch thread(s)). " + identity_line(results),
             "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in results:
        name = "/".join(Path(r["run"]).parts[-2:])
        pad = [""] * (depth - len(r["acceptance"]))
        rates = [f"{a:.1%}" if a is not None else "" for a in r["acceptance"]] + pad
        rates += [f"{a:.1%}" if a is not None else "" for a in r["text_agreement"]] + pad
        rates.append(f"{r['repeated_4grams']:.1%}")
        device = r.get("device", machine.get("gpu", machine["device"]))  # a study's rows name their own card
        lines.append(f"| {name} | {device} | {r['draft_vocabulary']} | {r['tokens_per_s']['plain']:.1f} | "
                     f"{r['tokens_per_s']['mtp']:.1f} | "
                     f"{r['speed_up']:.2f}x | {r['tokens_per_round']:.2f} | {r['round_in_steps']:.2f} | "
                     f"{r['verify_forward_in_steps']:.2f} | " + " | ".join(rates) + " |")
    lines += ["", "Acceptance at t+j: the share of rounds that proposed a draft for token t+j in which it was kept "
              "(with every draft before it); a verification adds the kept drafts and one token of its own. "
              "Round / plain step: the time of one drafting-and-verification round over a plain greedy step's "
              "(the speed-up is tokens per verification over it); verification forward / one-token forward: "
              "the model's forward over D + 1 new tokens after the prompt's cache over its forward over one "
              "(medians of alternating calls on the first prompt). Agreement on the text: over the same prompts' "
              "texts (prompt and new-token lengths), the share of positions where the predictor's argmax for token "
              "t+j, every token ahead the text's own (teacher-forced), is the next-token head's argmax for that "
              "token: the acceptance drafting would see on the corpus's own text rather than on greedy output. "
              "Draft vocabulary: the words a draft is chosen from (the model's `draft_vocab_size` most frequent "
              "training words, or every word; the same model, verified over every word either way). Greedy tokens "
              "repeating a 4-gram: the share of plain greedy's new tokens that end a 4-gram already in their "
              "sequence (output that repeats itself is easy to draft)."]
    (out / "speed.md").write_text("\n".join(lines) + "\n")


def identity_line(results: list[dict]) -> str:
    """Whether every drafted generation was plain greedy's, naming the runs where it was not."""
    failed = [f"{r['run']} ({r['draft_vocabulary']})" for r in results if not r["token_identical"]]
    if not failed:
        return "Every drafted generation was token-identical to plain greedy."
    return f"FAILED: drafted greedy differs from plain greedy on a prompt ({DRAFT_CHECK} expected) for {', '.join(failed)}."


def main(argv=None):
    import sys

    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    runs = mtp_runs(Path(args.runs))
    if not runs:
        raise SystemExit(f"No run with an mtp head under {args.runs}.")
    command = args.command or "python -m studies.mtp_speed " + " ".join(sys.argv[1:] if argv is None else argv)
    results = []
    for run in runs:
        for result in measure(run, args):
            if not result["token_identical"]:
                raise SystemExit(f"{run}: drafted greedy ({result['draft_vocabulary']}) differs from plain greedy on a "
                                 f"prompt: not {DRAFT_CHECK}.")
            results.append(result)
            print(json.dumps({k: result[k] for k in ("run", "draft_vocabulary", "tokens_per_s", "speed_up",
                                                     "acceptance")}), flush=True)
    settings = {k: getattr(args, k) for k in ("prompts", "prompt_tokens", "new_tokens", "repeats")}
    write(results, Path(args.output_dir), command, settings, machine_of(args.device, args.threads))


if __name__ == "__main__":
    main()
