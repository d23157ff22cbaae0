"""Trainable parameters and step memory of a LoRA run (`use_peft`) against a full fine-tune, on a
converted random Llama (the `llama-small` preset's sizes: width 512, 8 layers, 16,000 words) with a
`drill` head, on the CPU:

    python -m benchmarks.lora_memory

Each case runs in a fresh process (its peak memory its own): the model is converted, wrapped for
LoRA as `hf-outheads train --use_peft` wraps it (`hf_outheads/training/lora.py`: adapters on PEFT's default
modules, `q_proj` and `v_proj`, rank 16, the head trained fully), and one AdamW step (forward with
labels, backward, update) runs on `--batch` sequences of 256 tokens. `step MB` is the peak RSS during
that first step above the RSS before it: gradients, the optimizer's state (allocated by the first
step) and activations, whichever peak is higher (large allocations are forced to mmap so that freed
memory leaves RSS).

    python -m benchmarks.lora_memory --batch 1,8"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from types import SimpleNamespace

from benchmarks.bench_heads import rss_mb

BACKBONE = dict(hidden_size=512, intermediate_size=1376, num_hidden_layers=8, num_attention_heads=8,
                num_key_value_heads=8, max_position_embeddings=1024, vocab_size=16000, tie_word_embeddings=False,
                bos_token_id=1, eos_token_id=2, pad_token_id=0)
LENGTH = 256


def measure(lora: bool, batch: int) -> dict:
    """One case in this process: trainable parameters and the first step's memory."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from hf_outheads import OutHeadsForCausalLM
    from hf_outheads.training.lora import with_lora

    torch.manual_seed(0)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
    model = OutHeadsForCausalLM.from_backbone(LlamaForCausalLM(LlamaConfig(**BACKBONE)), head_type="drill")
    if lora:
        model = with_lora(model, SimpleNamespace(lora_r=16, lora_alpha=32, lora_dropout=0.05, lora_target_modules=[]))
    model.train()
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=1e-4)
    ids = torch.randint(3, BACKBONE["vocab_size"], (batch, LENGTH), generator=torch.Generator().manual_seed(0))
    before = rss_mb("VmRSS")
    with open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")  # reset the peak-RSS counter
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    return {"trainable": sum(p.numel() for p in trainable), "total": sum(p.numel() for p in model.parameters()),
            "step_mb": rss_mb("VmHWM") - before}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", default="1,8", help="sequences of a step, comma-separated (default 1,8)")
    parser.add_argument("--worker", choices=("full", "lora"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(measure(args.worker == "lora", int(args.batch))))
        return
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536", HF_HUB_OFFLINE="1")
    print("| training | sequences of 256 tokens | trainable parameters | step MB |\n| --- | --- | --- | --- |")
    for batch in args.batch.split(","):
        results = {}
        for case in ("full", "lora"):
            done = subprocess.run([sys.executable, "-m", "benchmarks.lora_memory", "--worker", case, "--batch", batch],
                                  env=env, capture_output=True, text=True, check=True)
            results[case] = json.loads(done.stdout.splitlines()[-1])
        full = results["full"]
        for case, result in results.items():
            print(f"| {case} | {batch} | {result['trainable']:,} ({result['trainable'] / full['trainable']:.1%}) | "
                  f"{result['step_mb']:.0f} ({result['step_mb'] / full['step_mb']:.2f}x) |")


if __name__ == "__main__":
    main()
