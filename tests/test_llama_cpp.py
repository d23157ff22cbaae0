"""llama.cpp for plain exports: one export per backbone kind (Llama, GPT-2) converted to GGUF by
llama.cpp's own `convert_hf_to_gguf.py` (`--outtype f32`) and read back with gguf's `GGUFReader`:
every tensor of the export is in the GGUF under llama.cpp's name, with its shape and values (after
the converter's rearrangements: Llama's q/k rows ordered for llama.cpp's rotary layout, GPT-2's
Conv1D weights transposed), nothing else is, and the vocabulary and context length come along.

The converter is plain Python: it comes from llama-cpp-python's source distribution
(`vendor/llama.cpp/`), downloaded at test time (`pip download --no-deps --no-binary :all:
llama-cpp-python==VERSION`) into a cache folder, once; without it (no network, no pip) the tests
skip, saying so (the `downloads` marker, tests/downloads.py: CI fails instead).

The Llama export carries a Llama-style tokenizer (a BPE with byte fallback, trained here with
`tokenizers`), which the converter takes as it is. The GPT-2 export carries the byte-level BPE that
training builds (`hf_outheads/training/tokenization.py`), whose pre-tokenizer the converter knows by no hash:
it runs through `hf_outheads/tools/gguf_convert.py`, which names it `gpt-2` (docs/serving.md).

The converted model then runs in llama.cpp itself: llama.cpp's prebuilt CPU binaries for x86-64
Linux as node-llama-cpp ships them (`npm install`, into the same cache folder, once; the `downloads`
marker again), driven by `tests/llama_cpp_logits.mjs`. llama.cpp's greedy tokens must be the
model's `generate()` tokens, and its next-token logits at every position those of the model."""

from __future__ import annotations

import json
import os
import platform
import re
import sys
import shutil
import tarfile
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from tokenizers import Tokenizer, decoders, models, normalizers, trainers
from transformers import PreTrainedTokenizerFast

from hf_outheads import OutHeadsConfig, OutHeadsForCausalLM
from hf_outheads.training.tokenization import train_tokenizer
from subprocess_runs import run
from tiny import tiny_config
from hf_outheads.tools import gguf_convert

VERSION = "0.3.36"  # llama-cpp-python, whose sdist vendors llama.cpp
NODE_LLAMA_CPP = "3.22.1"  # node-llama-cpp, whose npm packages carry llama.cpp built for each platform
ROOT = Path(__file__).resolve().parents[1]
CACHE = Path(os.environ.get("HF_OUTHEADS_TEST_CACHE", Path.home() / ".cache" / "hf_outheads"))
TREE = CACHE / f"llama-cpp-python-{VERSION}" / "llama.cpp"
CONVERTER_FILES = ("convert_hf_to_gguf.py", "conversion/", "gguf-py/")  # what the converter reads of the tree
TEXTS = [f"the quick brown fox jumps over the lazy dog {i} times, said Ada" for i in range(50)]
NEW_TOKENS = 16
# llama.cpp's logits against the model's (logits up to about 12 here): Llama's agree to float32
# rounding (2.4e-5 seen); GPT-2's GELU is looked up in a float16 table in llama.cpp's CPU code
# (GGML_GELU_FP16 in ggml-cpu/vec.h), which moves its logits by up to 4.2e-3 (seen; 1.8e-3 once the
# model's GELU was given float16 input and output)
LOGITS_ATOL = {"llama": 1e-4, "gpt2": 1e-2}


# HF name (per layer: after `model.layers.N.` / `transformer.h.N.`, which become `blk.N.`) -> GGUF name
NAMES = {
    "llama": {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output",
              "input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
              "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "post_attention_layernorm": "ffn_norm",
              "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"},
    "gpt2": {"transformer.wte": "token_embd", "transformer.wpe": "position_embd", "transformer.ln_f": "output_norm",
             "lm_head": "output", "ln_1": "attn_norm", "attn.c_attn": "attn_qkv", "attn.c_proj": "attn_output",
             "ln_2": "ffn_norm", "mlp.c_fc": "ffn_up", "mlp.c_proj": "ffn_down"},
}
LAYER = re.compile(r"^(?:model\.layers|transformer\.h)\.(\d+)\.(.+)$")


def made_once(target: Path, fill) -> Path:
    """`target`, filled by `fill(folder)` in a folder beside it, then renamed: an interrupted fill is redone."""
    staging = target.with_name(target.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    fill(staging)
    staging.rename(target)
    return target


def llama_cpp_tree() -> Path:
    """llama.cpp's converter files from llama-cpp-python's sdist, downloaded and unpacked once."""
    if (TREE / CONVERTER_FILES[0]).is_file():
        return TREE
    CACHE.mkdir(parents=True, exist_ok=True)
    archive = CACHE / f"llama_cpp_python-{VERSION}.tar.gz"
    if not archive.exists():
        done = run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                    f"llama-cpp-python=={VERSION}", "-d", str(CACHE), "-q"], timeout=600)
        if done.returncode or not archive.exists():
            pytest.skip(f"cannot download llama-cpp-python=={VERSION}'s source distribution: {done.stderr[-300:]}")
    prefix = f"llama_cpp_python-{VERSION}/vendor/llama.cpp/"

    def unpack(folder):
        with tarfile.open(archive) as tar:
            for member in tar.getmembers():
                name = member.name.removeprefix(prefix)
                if member.name.startswith(prefix) and member.isfile() and name.startswith(CONVERTER_FILES):
                    member.name = name
                    tar.extract(member, folder, filter="data")

    return made_once(TREE, unpack)


def node_llama_cpp() -> Path:
    """A folder whose node_modules holds node-llama-cpp with its prebuilt x86-64 Linux CPU build of
    llama.cpp (and no other platform's), installed from the npm registry once."""
    prefix = CACHE / f"node-llama-cpp-{NODE_LLAMA_CPP}"
    if (prefix / "node_modules" / "@node-llama-cpp" / "linux-x64" / "package.json").is_file():
        return prefix
    if (sys.platform, platform.machine()) != ("linux", "x86_64"):
        pytest.skip(f"node-llama-cpp's CPU build of llama.cpp is taken for x86-64 Linux only, not {platform.machine()}")
    npm = shutil.which("npm")
    if npm is None or shutil.which("node") is None:
        pytest.skip("needs Node.js and npm to install node-llama-cpp (llama.cpp's prebuilt binaries)")

    def install(folder):
        done = run([npm, "install", "--prefix", str(folder), "--no-save", "--no-audit", "--no-fund", "--omit=optional",
                    "--ignore-scripts", f"node-llama-cpp@{NODE_LLAMA_CPP}", f"@node-llama-cpp/linux-x64@{NODE_LLAMA_CPP}"],
                   timeout=600)
        if done.returncode:
            pytest.skip(f"cannot install node-llama-cpp@{NODE_LLAMA_CPP} from the npm registry: {done.stderr[-300:]}")

    return made_once(prefix, install)


def llama_style_tokenizer() -> PreTrainedTokenizerFast:
    """A BPE with byte fallback and Llama's `▁` spaces (the layout of Llama 2's tokenizer.json)."""
    backend = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    backend.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    backend.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                         decoders.Strip(" ", 1, 0)])
    bytes_ = [f"<0x{b:02X}>" for b in range(256)]
    backend.train_from_iterator(TEXTS, trainer=trainers.BpeTrainer(
        vocab_size=340, special_tokens=["<unk>", "<s>", "</s>", *bytes_], show_progress=False))
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", bos_token="<s>", eos_token="</s>")


def gguf_name(family: str, name: str) -> str:
    stem, kind = name.rsplit(".", 1)
    layer = LAYER.match(stem)
    if layer:
        return f"blk.{layer[1]}.{NAMES[family][layer[2]]}.{kind}"
    return f"{NAMES[family][stem]}.{kind}"


def rotary_rows(weight: torch.Tensor, heads: int) -> torch.Tensor:
    """A q/k projection's rows as llama.cpp stores them: in each head, the two rotary halves interleaved."""
    return weight.reshape(heads, 2, weight.shape[0] // heads // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def as_converted(family: str, config, name: str, tensor: torch.Tensor) -> torch.Tensor:
    if family == "llama" and name.endswith("q_proj.weight"):
        return rotary_rows(tensor, config.num_attention_heads)
    if family == "llama" and name.endswith("k_proj.weight"):
        return rotary_rows(tensor, config.num_key_value_heads)
    if family == "gpt2" and name.endswith(("c_attn.weight", "c_proj.weight", "c_fc.weight")):
        return tensor.T  # Conv1D keeps (in, out)
    return tensor


CASES = {  # family -> head (no output bias), tokenizer, converter command before the export folder
    "llama": ("drill", llama_style_tokenizer, lambda tree: [str(tree / "convert_hf_to_gguf.py")]),
    "gpt2": ("tied", lambda: train_tokenizer(TEXTS, "bpe", vocab_size=300, min_frequency=1),
             lambda tree: ["-m", "hf_outheads.tools.gguf_convert", str(tree)]),
}


def convert(family: str, folder: Path):
    """A random model of `family` with its tokenizer, exported plain and converted to GGUF (f32) in `folder`.
    A wide initialisation, so that greedy decoding does not repeat one token."""
    head, make_tokenizer, converter = CASES[family]
    tree = llama_cpp_tree()
    tokenizer = make_tokenizer()
    text = tiny_config(family)
    text.vocab_size = len(tokenizer)
    text.initializer_range = 0.5
    torch.manual_seed(0)
    model = OutHeadsForCausalLM(OutHeadsConfig(text_config=text, head_type=head, head_options={"output_bias": False}))
    assert model.export_plain(folder / "plain", tokenizer).exact
    done = run([sys.executable, *converter(tree), str(folder / "plain"), "--outtype", "f32",
                "--outfile", str(folder / "model.gguf")], cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return model.eval(), tokenizer, folder / "model.gguf"


@pytest.fixture(scope="module", params=list(CASES))
def converted(request, tmp_path_factory):
    """(family, model, tokenizer, GGUF path), once per family for this module's tests."""
    return request.param, *convert(request.param, tmp_path_factory.mktemp(request.param))


@pytest.mark.downloads(f"llama-cpp-python=={VERSION}'s source distribution from PyPI, for llama.cpp's "
                       "convert_hf_to_gguf.py")
def test_a_plain_export_converts_to_gguf_with_every_tensor(converted):
    from gguf import GGUFReader

    family, model, tokenizer, gguf_file = converted
    text = model.config.text_config
    folder = gguf_file.parent
    reader = GGUFReader(gguf_file)
    tensors = {tensor.name: tensor for tensor in reader.tensors}
    exported = load_file(folder / "plain" / "model.safetensors")
    assert sorted(tensors) == sorted(gguf_name(family, name) for name in exported)
    for name, weight in exported.items():
        tensor = tensors[gguf_name(family, name)]
        want = as_converted(family, text, name, weight)
        assert tuple(reversed(tensor.shape.tolist())) == tuple(want.shape), name  # GGUF lists dimensions inner first
        assert torch.equal(torch.from_numpy(tensor.data.copy()).reshape(want.shape), want), name
    fields = {name: field.contents() for name, field in reader.fields.items()}
    assert fields["general.architecture"] == family
    assert fields[f"{family}.context_length"] == 64  # GPT-2's from the export's n_ctx
    assert fields["tokenizer.ggml.tokens"] == tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))


@pytest.mark.downloads(f"llama-cpp-python=={VERSION}'s source distribution from PyPI (the converter) and "
                       f"node-llama-cpp@{NODE_LLAMA_CPP} from the npm registry (llama.cpp's prebuilt CPU binaries)")
def test_llama_cpp_runs_the_converted_export_as_the_model_does(converted, tmp_path):
    """In llama.cpp the GGUF generates the model's greedy tokens, with the model's logits at every step."""
    family, model, tokenizer, gguf_file = converted
    prefix = node_llama_cpp()
    ids = tokenizer("the quick brown fox jumps over", add_special_tokens=False)["input_ids"]
    (tmp_path / "ids.json").write_text(json.dumps(ids))
    done = run(["node", str(ROOT / "tests" / "llama_cpp_logits.mjs"), str(prefix), str(gguf_file),
                str(tmp_path / "ids.json"), str(NEW_TOKENS)], timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    llama_cpp = json.loads(done.stdout)

    with torch.no_grad():
        greedy = model.generate(torch.tensor([ids]), max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                                do_sample=False)[0, len(ids):].tolist()
        logits = model(torch.tensor([ids + greedy])).logits[0]
    assert len(set(greedy)) > 3, greedy  # a sequence that can tell one model from another
    assert llama_cpp["greedy"] == greedy
    theirs = torch.tensor(llama_cpp["logits"])
    assert theirs.shape == logits.shape
    torch.testing.assert_close(theirs, logits, rtol=0, atol=LOGITS_ATOL[family])


def test_gguf_convert_refuses_a_missing_tree_or_tokenizer_in_one_line(tmp_path, capsys):
    (tmp_path / "llama.cpp" / "conversion").mkdir(parents=True)
    (tmp_path / "llama.cpp" / "convert_hf_to_gguf.py").touch()
    (tmp_path / "llama.cpp" / "conversion" / "base.py").touch()
    (tmp_path / "plain").mkdir()
    for args, said in [([], "usage: hf-outheads gguf LLAMA_CPP_DIR PLAIN_DIR"),
                       ([str(tmp_path), str(tmp_path / "plain")], "has no convert_hf_to_gguf.py with its conversion/"),
                       ([str(tmp_path / "llama.cpp"), str(tmp_path / "plain")], "has no tokenizer.json: export with")]:
        with pytest.raises(SystemExit) as refused:
            gguf_convert.main(args)
        err = capsys.readouterr().err
        assert refused.value.code == 2 and said in err and len(err.strip().splitlines()) == 1, err
