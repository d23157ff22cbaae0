"""`hf-outheads train --use_peft` (TRL's option names) on a converted pretrained model: LoRA adapters on the
backbone through PEFT, the new head trained fully. The run trains, saves the merged model (loaded by
`AutoModelForCausalLM` with and without the package, exported as the backbone's own class, served by
`hf-outheads serve`) and the adapter (loaded by `PeftModel.from_pretrained` on the converted backbone),
and an interrupted run resumes to the weights of an uninterrupted one. A tiny random Llama and a
word-level tokenizer, made here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

peft = pytest.importorskip("peft")

from safetensors.torch import load_file  # noqa: E402
from tokenizers import Tokenizer, models, pre_tokenizers  # noqa: E402
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast  # noqa: E402

import hf_outheads.configuration_outheads  # noqa: E402,F401  (registers the Auto classes)
from hf_outheads import OutHeadsForCausalLM  # noqa: E402
from subprocess_runs import run  # noqa: E402
from tiny import VOCAB, tiny_original  # noqa: E402

CLI = Path(sys.executable).with_name("hf-outheads")
ENV = {**{k: v for k, v in os.environ.items() if k != "ACCELERATE_USE_CPU"}, "HF_HUB_OFFLINE": "1",
       "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}
HEAD, HEAD_OPTIONS = "drill", {"output_bias": False}  # affine without a bias: the run exports exactly


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    """A folder holding a tiny random Llama with its tokenizer (`w<i>` is id i), and text files of those words."""
    folder = tmp_path_factory.mktemp("lora")
    words = ["<pad>", "<s>", "</s>", "<unk>"] + [f"w{i}" for i in range(4, VOCAB)]
    model = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    model.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=model, pad_token="<pad>", bos_token="<s>", eos_token="</s>",
                                        unk_token="<unk>")
    tiny_original("llama").save_pretrained(folder / "base")
    tokenizer.save_pretrained(folder / "base")
    generator = torch.Generator().manual_seed(0)
    for split, lines in (("train", 64), ("validation", 8)):
        texts = (" ".join(f"w{i}" for i in torch.randint(4, VOCAB, (24,), generator=generator).tolist())
                 for _ in range(lines))
        (folder / f"{split}.txt").write_text("\n".join(texts) + "\n")
    return folder


def train(folder: Path, output: str, *flags: str) -> subprocess.CompletedProcess:
    command = [str(CLI), "train", "--pretrained", "base", "--head_type", HEAD, "--head_options", json.dumps(HEAD_OPTIONS),
               "--use_peft", "true", "--lora_r", "4", "--lora_alpha", "8", "--lora_dropout", "0",
               "--lora_target_modules", "[q_proj, v_proj]", "--dropout", "0",
               "--data_files", "{train: train.txt, validation: validation.txt}", "--block_size", "16",
               "--per_device_train_batch_size", "4", "--learning_rate", "1e-2", "--max_steps", "4", "--save_steps", "2",
               "--logging_steps", "1", "--sample_max_new_tokens", "3", "--output_dir", output, *flags]
    done = run(command, env=ENV, cwd=folder)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    return done


@pytest.fixture(scope="module")
def runs(base):
    """The same LoRA run twice: straight through, and stopped after its checkpoint at step 2 then resumed by
    the same command."""
    train(base, "whole")
    stopped = train(base, "resumed", "--stop_after_steps", "2")
    resumed = train(base, "resumed", "--stop_after_steps", "2")
    return base, stopped.stdout + stopped.stderr, resumed.stdout + resumed.stderr


def start_event(output_dir: Path) -> dict:
    return json.loads((output_dir / "metrics.jsonl").read_text().splitlines()[0])


def test_the_adapters_and_the_head_train_and_the_rest_stays_frozen(runs):
    folder, _, _ = runs
    out = folder / "whole"
    start, pretrained = start_event(out), load_file(folder / "base" / "model.safetensors")
    merged = load_file(out / "model.safetensors")
    adapter = load_file(out / "adapter" / "adapter_model.safetensors")
    lora_b = {name: value for name, value in adapter.items() if "lora_B" in name}
    head = {name: value for name, value in adapter.items() if ".head." in name}
    assert len(lora_b) == 4 and all(value.abs().max() > 0 for value in lora_b.values())  # B starts at zero: trained
    assert "| use_peft | True |" in (out / "README.md").read_text() and "| lora_r | 4 |" in (out / "README.md").read_text()
    assert head and start["parameters"] == start["head_parameters"] + sum(
        value.numel() for name, value in adapter.items() if "lora_" in name)
    for name, value in pretrained.items():  # the backbone: its adapted matrices merged, every other one as it was
        if name == "lm_head.weight":  # replaced by the head
            continue
        adapted = name.endswith(("q_proj.weight", "v_proj.weight"))
        assert torch.equal(merged[name.replace("model.", "backbone.", 1)], value) != adapted, name


def test_the_run_reloads_with_and_without_the_package_and_as_peft_adapter(runs):
    folder, _, _ = runs
    out = folder / "whole"
    ids = torch.randint(4, VOCAB, (2, 12), generator=torch.Generator().manual_seed(1))
    model = AutoModelForCausalLM.from_pretrained(out).eval()
    assert type(model) is OutHeadsForCausalLM and model.config.head_type == HEAD
    converted = OutHeadsForCausalLM.from_backbone(str(folder / "base"), head_type=HEAD, head_options=HEAD_OPTIONS)
    adapted = peft.PeftModel.from_pretrained(converted, out / "adapter").eval()
    with torch.no_grad():
        logits = model(ids).logits
        torch.testing.assert_close(adapted(ids).logits, logits, rtol=1e-5, atol=1e-5)
    code = ("import sys, torch\nfrom transformers import AutoModelForCausalLM\n"
            f"model = AutoModelForCausalLM.from_pretrained({str(out)!r}, trust_remote_code=True).eval()\n"
            f"ids = torch.tensor({ids.tolist()})\n"
            "assert 'hf_outheads' not in sys.modules\n"
            "print(model(ids).logits.abs().sum().item())")
    done = subprocess.run([sys.executable, "-c", code], stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=120, cwd=folder, env=ENV)
    assert done.returncode == 0, done.stderr[-3000:]
    assert float(done.stdout.split()[-1]) == pytest.approx(logits.abs().sum().item(), rel=1e-5)


def test_the_run_exports_as_its_backbones_own_class(runs, tmp_path):
    folder, _, _ = runs
    done = run([str(CLI), "export", str(folder / "whole"), str(tmp_path / "plain")], env=ENV, cwd=folder)
    assert done.returncode == 0, done.stderr[-3000:]
    plain = AutoModelForCausalLM.from_pretrained(tmp_path / "plain").eval()
    model = AutoModelForCausalLM.from_pretrained(folder / "whole").eval()
    ids = torch.randint(4, VOCAB, (2, 12), generator=torch.Generator().manual_seed(2))
    assert type(plain).__name__ == "LlamaForCausalLM"
    with torch.no_grad():
        torch.testing.assert_close(plain(ids).logits, model(ids).logits, rtol=1e-4, atol=1e-4)


def test_the_run_is_served_with_the_tokens_generate_gives(runs, tmp_path):
    """`hf-outheads serve RUN` serves the merged model: greedy completions equal `generate()`'s here."""
    pytest.importorskip("openai")
    from transformers import AutoTokenizer

    from benchmarks.served import server

    folder = str(runs[0] / "whole")
    model, tokenizer = AutoModelForCausalLM.from_pretrained(folder).eval(), AutoTokenizer.from_pretrained(folder)
    prompt = "w5 w17 w42"
    ids = tokenizer(prompt, return_tensors="pt").input_ids
    want = tokenizer.decode(model.generate(ids, max_new_tokens=6, do_sample=False)[0, ids.shape[1]:],
                            skip_special_tokens=True)
    with server("hf-outheads", folder, log=tmp_path / "server.log") as client:
        answer = client.completions.create(model=folder, prompt=prompt, max_tokens=6, temperature=0)
    assert answer.choices[0].text.strip() == want.strip() and want.strip()


def test_an_interrupted_lora_run_resumes_to_the_uninterrupted_weights(runs):
    folder, stopped, resumed = runs
    assert "Stopped after step 2" in stopped and "Resumed from" in resumed
    whole, again = folder / "whole", folder / "resumed"
    assert load_file(again / "adapter" / "adapter_model.safetensors").keys() == \
        load_file(whole / "adapter" / "adapter_model.safetensors").keys()
    merged, merged_again = load_file(whole / "model.safetensors"), load_file(again / "model.safetensors")
    for name, value in merged.items():
        torch.testing.assert_close(merged_again[name], value, rtol=1e-6, atol=1e-7, msg=name)


def test_lora_and_trainable_modules_exclude_each_other():
    from hf_outheads.training.options import parse_options

    with pytest.raises(ValueError, match=r"use_peft and trainable_modules=\['head'\] exclude each other"):
        parse_options(["--use_peft", "true", "--trainable_modules", "[head]"])


def test_a_target_module_the_backbone_lacks_is_named(base):
    from hf_outheads.training.lora import target_modules

    model = OutHeadsForCausalLM.from_backbone(str(base / "base"), head_type=HEAD, head_options=HEAD_OPTIONS)
    assert target_modules(model, []) == [f"backbone.layers.{i}.self_attn.{m}" for i in range(2) for m in ("q_proj", "v_proj")]
    assert all(name.startswith("backbone.") for name in target_modules(model, ["all-linear"]))
    with pytest.raises(ValueError, match=r"lora_target_modules: \['c_attn'\] names no module of the llama backbone; "
                                         r"its modules are named .*q_proj"):
        target_modules(model, ["c_attn"])
