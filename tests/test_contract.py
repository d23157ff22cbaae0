"""The contract every head meets on each backbone kind: one row of tests/head_cases.py per head.

Heads x {causal (Llama), seq2seq (T5)}: forward/backward, training, loss = cross-entropy of
the logits, bf16, logits_to_keep, cached generation, save/load, Auto classes, remote code.
"""

import ast
import json
import os
import re
import subprocess
import sys
import traceback
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch.overrides import TorchFunctionMode
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoModelForSeq2SeqLM

from hf_outheads import HEAD_CLASSES, OutHeadsConfig, get_head_class
from head_cases import HEAD_CASES
from tiny import SEQ2SEQ, batch, model_class, tiny_config, tiny_model

BACKBONES = ("llama", "t5")
CASES = [(head, backbone) for head in sorted(HEAD_CASES) for backbone in BACKBONES]
IDS = [f"{head}-{backbone}" for head, backbone in CASES]


def auto_class(backbone):
    return AutoModelForSeq2SeqLM if backbone in SEQ2SEQ else AutoModelForCausalLM


def inputs_only(backbone):
    """The batch without labels (seq2seq: decoder inputs from the labels, as in training)."""
    inputs = batch(backbone)
    labels = inputs.pop("labels")
    if backbone in SEQ2SEQ:
        shifted = torch.full_like(labels, tiny_config(backbone).decoder_start_token_id)
        shifted[:, 1:] = labels[:, :-1]
        inputs["decoder_input_ids"] = shifted
    return inputs


def config_fields(config):
    """Everything a config states except where it was loaded from."""
    return {key: value for key, value in config.to_dict().items() if key != "_name_or_path"}


def logits_of(model, inputs):
    with torch.no_grad():
        return model(**inputs).logits


TOY_HEAD = '''"""`toy`: a throwaway head of the completeness test (an untied softmax)."""

from .head_interface import Paper, register_head
from .head_linear import LinearHead, LinearOptions


class ToyOptions(LinearOptions):
    """`toy`'s options: `linear`'s."""


@register_head
class ToyHead(LinearHead):
    head_type = "toy"
    Options = ToyOptions
    papers = (Paper("A Toy Output Layer", "https://example.org/toy",
                    "@misc{toy2026, title = {A Toy}, author = {Doe, Jane and Roe, Richard}, year = {2026}}",
                    arxiv="2601.00001"),)
    exact_plain_export = True
    benchmark_options = {"": {}, "small": {"output_bias": False}}
    contract_options = {"output_bias": False}
'''

CHECK_TOY = """
import sys
import hf_outheads, torch
from hf_outheads import OutHeadsConfig, OutHeadsForCausalLM
from hf_outheads.tools.export_plain import plain_export_capabilities
from hf_outheads.tools.model_card import build_model_card, citation_section
from head_cases import HEAD_CASES
from benchmarks.bench_heads import HEAD_VARIANTS, run_case
from sharded_cases import CASES
from tiny import tiny_config
from hf_outheads.training.options import head_spec

assert "/copy/" in hf_outheads.__file__, hf_outheads.__file__
model = OutHeadsForCausalLM(OutHeadsConfig(text_config=tiny_config("llama"), head_type="toy",
                                           head_options=HEAD_CASES["toy"]))
card = str(build_model_card(model))
assert "arxiv:2601.00001" in card and "outheads-toy" in card, card
assert "@misc{toy2026" in citation_section(model.config.head_class)
assert HEAD_VARIANTS["toy"] == {} and HEAD_VARIANTS["toy-small"] == {"head_type": "toy", "output_bias": False}
assert head_spec("toy-small", HEAD_VARIANTS).head_type == "toy" and CASES["toy"].head_type == "toy"
measured = run_case(dict(head="toy-small", vocab=64, positions=32, reps=1, threads=1, warmup=True, device="cpu",
                         dtype="fp32", backbone="gpt2-tiny", gen_tokens=0, gen_reps=1))
assert measured["step_s"] > 0 and measured["step_vs_tied"] > 0, measured
assert plain_export_capabilities()["toy"] is True
from maintainer.doc_tables import head_table, serving_table
assert "| `toy` ([Doe & Roe 2026](https://arxiv.org/abs/2601.00001)) | not run in the comparisons |" in head_table(), head_table()
assert "`toy`" in next(line for line in serving_table().splitlines() if line.startswith("| `linear`"))
assert HEAD_CASES["toy"] == {"output_bias": False}
assert model.export_plain(sys.argv[1]).exact
print("toy everywhere")
"""


def test_every_registered_head_has_a_case():
    assert set(HEAD_CLASSES) == set(HEAD_CASES)


def test_heads_register_explicitly_and_a_taken_name_is_refused():
    """`register_head` files a head class under its `head_type`; a second class with a taken name is a
    ValueError and leaves the first in place (as peft's `register_peft_method`)."""
    from hf_outheads.head_interface import register_head
    from hf_outheads.head_tied import TiedHead

    assert register_head(TiedHead) is TiedHead and HEAD_CLASSES["tied"] is TiedHead  # the same class again: as it is

    class OtherTied(TiedHead):
        head_type = "tied"

    with pytest.raises(ValueError, match=r"Head type 'tied' is taken by hf_outheads\.head_tied\.TiedHead: give "
                                         r".*OtherTied another head_type"):
        register_head(OtherTied)
    assert HEAD_CLASSES["tied"] is TiedHead and TiedHead.Options.head_class is TiedHead  # what a model builds
    with pytest.raises(TypeError, match="register_head takes an OutputHead subclass"):
        register_head(torch.nn.Linear)


def test_a_new_head_is_one_file_and_one_catalog_line(tmp_path):
    """A throwaway head in a copy of the package: its file (its class registered with `register_head`)
    plus one import line in head_catalog.py, nothing else; its card (tags and citation), the
    benchmark's cases (one measured), the export's
    capability table, the README's head and serving tables, the contract cases and the
    sharded-training cases all pick it up, and the
    FSDP2 worker trains it on two processes as it trains unsharded."""
    import shutil
    from pathlib import Path

    from subprocess_runs import run

    root = Path(__file__).resolve().parents[1]
    package = tmp_path / "copy" / "hf_outheads"
    shutil.copytree(root / "hf_outheads", package, ignore=shutil.ignore_patterns("__pycache__"))
    (package / "head_toy.py").write_text(TOY_HEAD)
    catalog = (package / "head_catalog.py").read_text()
    line = "from .head_sigsoftmax import SigSoftmaxHead\n"
    assert line in catalog
    (package / "head_catalog.py").write_text(catalog.replace(line, line + "from .head_toy import ToyHead\n"))
    # the copy first, then the tests' helpers and the repository (the benchmarks)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(package.parent), str(root / "tests"), str(root)])}
    result = run([sys.executable, "-c", CHECK_TOY, str(tmp_path / "plain")], env=env, timeout=240, cwd=tmp_path)
    assert result.returncode == 0 and "toy everywhere" in result.stdout, result.stderr[-3000:]
    out = tmp_path / "fsdp.json"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
               str(root / "tests" / "fsdp_worker.py"), str(out), "toy"]
    result = run(command, env={**env, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}, timeout=240, cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    toy = json.loads(out.read_text())["toy"]
    assert toy["losses"] == pytest.approx(toy["expected_losses"], abs=1e-5) and toy["weight_diff"] < 1e-5, toy


@pytest.mark.parametrize("head,backbone", CASES, ids=IDS)
def test_forward_backward_reaches_head(head, backbone):
    model = tiny_model(backbone, head, HEAD_CASES[head]).train()  # the training path (dropout; heads may skip logits)
    data = batch(backbone)
    out = model(**data)
    assert out.logits is None or out.logits.shape[-1] == model.config.vocab_size
    assert torch.isfinite(out.loss)
    out.loss.backward()
    for name, param in model.head.named_parameters():
        assert param.grad is not None, f"no gradient reaches head.{name}"
        assert torch.isfinite(param.grad).all() and param.grad.abs().sum() > 0, f"head.{name}: zero/NaN gradient"


class HostReads(TorchFunctionMode):
    """Counts what reads a tensor's values back to the host (a wait for the device on a GPU): `.item()`,
    `.tolist()`, `bool()` / `int()` / `float()` of a tensor, and the operations whose output size
    depends on the values (`nonzero`, `unique`, a boolean mask as an index, ...)."""

    READS = {torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.__bool__, torch.Tensor.__int__,
             torch.Tensor.__float__, torch.Tensor.__index__, torch.Tensor.numpy, torch.Tensor.nonzero, torch.nonzero,
             torch.Tensor.unique, torch.unique, torch.Tensor.masked_select, torch.masked_select, torch.argwhere}

    def __init__(self):
        super().__init__()
        self.reads = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        index = args[1] if func is torch.Tensor.__getitem__ and len(args) > 1 else None
        masks = [i for i in (index if isinstance(index, tuple) else (index,))
                 if isinstance(i, torch.Tensor) and i.dtype == torch.bool]
        if func in self.READS or masks:
            caller = next(frame for frame in reversed(traceback.extract_stack()[:-1])
                          if "/torch/" not in frame.filename)
            self.reads.append(f"{getattr(func, '__name__', func)} at {Path(caller.filename).name}:{caller.lineno}")
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("head,backbone", CASES, ids=IDS)
def test_a_training_step_reads_nothing_back_from_the_device(head, backbone):
    """A training forward with labels and its backward read no value back from the device, for
    every training loss the head offers (ids and labels are checked where a batch is built, on the host;
    `generate` checks its prompt once per call). `sampled` picks its candidates from the batch's
    targets, so it reads them: not a loss of the fast path."""
    losses = get_head_class(head).training_losses()
    for loss in [loss for loss in losses if loss != "sampled"]:
        options = {**HEAD_CASES[head], **({} if loss == "exact" else {"training_loss": loss})}
        model = tiny_model(backbone, head, options).train()
        model.head.begin_periodic_updates()  # lightrnn collects its table's statistics in the step
        data = batch(backbone)
        with HostReads() as host:
            model(**data).loss.backward()
        assert host.reads == [], (loss, host.reads)


@pytest.mark.parametrize("head,backbone", CASES, ids=IDS)
def test_loss_is_cross_entropy_of_logits(head, backbone):
    """The head's own loss (`nll_loss`) is the NLL of the scores it returns, and so is `loss` outside training."""
    model = tiny_model(backbone, head, HEAD_CASES[head])
    data = batch(backbone)
    with torch.no_grad():
        out = model(**data)
        logits = model(**inputs_only(backbone)).logits
    assert logits.shape == (*data["labels"].shape, model.config.vocab_size)
    if model.head.returns_log_probs:
        torch.testing.assert_close(logits.logsumexp(-1), torch.zeros(logits.shape[:-1]), atol=1e-4, rtol=0)
    labels = data["labels"]
    if backbone not in SEQ2SEQ:
        logits, labels = logits[:, :-1], labels[:, 1:]
    want = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1))
    torch.testing.assert_close(out.nll_loss, want, rtol=1e-4, atol=1e-5)
    # outside training `loss` is the next-token NLL, every head's training terms left out: exp(loss) is the perplexity
    torch.testing.assert_close(out.loss, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("head,backbone", CASES, ids=IDS)
def test_training_reduces_loss(head, backbone):
    model = tiny_model(backbone, head, HEAD_CASES[head])
    data = batch(backbone)
    with torch.no_grad():
        before = model(**data).loss.item()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model.train()
    for _ in range(6):
        optimizer.zero_grad()
        model(**data).loss.backward()
        optimizer.step()
    model.eval()
    with torch.no_grad():
        after = model(**data).loss.item()
    assert after < before - 0.1, (before, after)


@pytest.mark.parametrize("head,backbone", CASES, ids=IDS)
def test_bf16_forward_and_backward(head, backbone):
    model = tiny_model(backbone, head, HEAD_CASES[head])
    data = batch(backbone)
    with torch.no_grad():
        fp32_loss = model(**data).loss
    model.to(torch.bfloat16)
    with torch.no_grad():
        loss = model(**data).loss
    torch.testing.assert_close(loss.float(), fp32_loss, rtol=0.05, atol=0.05)
    model.train()(**data).loss.backward()  # a training step's loss: every head's parameters in it (mtp's predictors)
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.head.parameters())


@pytest.mark.parametrize("head,backbone", CASES, ids=IDS)
def test_logits_to_keep_and_cached_generation(head, backbone):
    model = tiny_model(backbone, head, HEAD_CASES[head])
    inputs = inputs_only(backbone)
    full = logits_of(model, inputs)
    torch.testing.assert_close(logits_of(model, dict(inputs, logits_to_keep=2)), full[:, -2:], rtol=1e-5, atol=1e-5)
    prompt = {"input_ids": inputs["input_ids"]}
    generated = [model.generate(**prompt, max_new_tokens=4, min_new_tokens=4, do_sample=False, use_cache=cache)
                 for cache in (True, False)]
    assert generated[0].shape[1] >= 4 and torch.equal(*generated)


@pytest.mark.parametrize("head,backbone", CASES, ids=IDS)
def test_save_load_and_auto_classes(head, backbone, tmp_path):
    model = tiny_model(backbone, head, HEAD_CASES[head])
    model.save_pretrained(tmp_path)
    inputs = inputs_only(backbone)
    want = logits_of(model, inputs)
    config = AutoConfig.from_pretrained(tmp_path)
    assert type(config) is OutHeadsConfig
    assert (config.head_type, config.head_options) == (head, model.config.head_options)
    assert config_fields(config) == config_fields(model.config)
    for loader in (model_class(backbone), auto_class(backbone), AutoModel):
        reloaded = loader.from_pretrained(tmp_path).eval()
        assert type(reloaded) is model_class(backbone), loader
        assert torch.equal(logits_of(reloaded, inputs), want), loader


REMOTE_SCRIPT = r"""
import sys
sys.modules["hf_outheads"] = None  # the package must not be importable: only the saved code files
import json, torch, transformers
try:
    import hf_outheads
    raise SystemExit("hf_outheads is importable in the remote-code subprocess")
except ImportError:
    pass
results = {}
for case in json.load(open(sys.argv[1])):
    try:
        auto = getattr(transformers, case["auto"])
        model = auto.from_pretrained(case["folder"], trust_remote_code=True).eval()
        plain = transformers.AutoModel.from_pretrained(case["folder"], trust_remote_code=True)
        inputs = torch.load(case["folder"] + "/inputs.pt")
        with torch.no_grad():
            logits = model(**inputs).logits
        torch.save(logits, case["folder"] + "/remote_logits.pt")
        generated = model.generate(input_ids=inputs["input_ids"], max_new_tokens=3, min_new_tokens=3, do_sample=False)
        torch.save(generated, case["folder"] + "/remote_generated.pt")
        results[case["id"]] = {"module": type(model).__module__, "class": type(model).__name__,
                               "automodel_class": type(plain).__name__,
                               # its head is of the model's copy of the head files (the config's is another)
                               "models_head": isinstance(model.head, sys.modules[type(model).__module__].OutputHead)}
    except Exception as error:
        results[case["id"]] = {"error": f"{type(error).__name__}: {error}"}
print(json.dumps(results))
"""


def greedy(model, inputs):
    return model.generate(input_ids=inputs["input_ids"], max_new_tokens=3, min_new_tokens=3, do_sample=False)


def broken_checkpoint(root):
    """A saved `linear` model without `head.bias`: remote loading must refuse it too."""
    folder = root / "missing-head-bias"
    tiny_model("llama", "linear", HEAD_CASES["linear"]).save_pretrained(folder)
    weights = load_file(folder / "model.safetensors")
    del weights["head.bias"]
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    torch.save(inputs_only("llama"), folder / "inputs.pt")
    return {"id": folder.name, "folder": str(folder), "auto": "AutoModelForCausalLM"}


@pytest.fixture(scope="module")
def remote_loads(tmp_path_factory):
    """Save every case, load them all with trust_remote_code in ONE fresh process."""
    root = tmp_path_factory.mktemp("remote")
    cases, expected = [], {}
    for (head, backbone), case_id in zip(CASES, IDS):
        folder = root / case_id
        try:
            model = tiny_model(backbone, head, HEAD_CASES[head])
        except Exception as error:  # reported by the test of this case
            expected[case_id] = error
            continue
        model.save_pretrained(folder)
        inputs = inputs_only(backbone)
        torch.save(inputs, folder / "inputs.pt")
        expected[case_id] = logits_of(model, inputs)
        torch.save(greedy(model, inputs), folder / "generated.pt")
        cases.append({"id": case_id, "folder": str(folder), "auto": auto_class(backbone).__name__})
    cases.append(broken_checkpoint(root))
    (root / "cases.json").write_text(json.dumps(cases))
    (root / "load.py").write_text(REMOTE_SCRIPT)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(HF_HUB_OFFLINE="1", HF_MODULES_CACHE=str(root / "modules"))
    run = subprocess.run([sys.executable, str(root / "load.py"), str(root / "cases.json")], cwd=root, env=env,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    return root, expected, json.loads(run.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("head,backbone", CASES, ids=IDS)
def test_remote_code_load_in_fresh_process(head, backbone, remote_loads):
    root, expected, results = remote_loads
    case_id = f"{head}-{backbone}"
    if isinstance(expected[case_id], Exception):
        raise expected[case_id]
    result = results[case_id]
    assert "error" not in result, result.get("error")
    assert result["module"].startswith("transformers_modules.")
    assert result["class"] == result["automodel_class"] == model_class(backbone).__name__
    assert result["models_head"]  # what the model's own code recognises (`_init_weights`, its hooks)
    assert torch.equal(torch.load(root / case_id / "remote_logits.pt"), expected[case_id])
    assert torch.equal(torch.load(root / case_id / "remote_generated.pt"), torch.load(root / case_id / "generated.pt"))


PACKAGE = Path(__import__("hf_outheads").__file__).parent
TOOL_FILES = {path.name for path in (PACKAGE / "tools").glob("*.py")}  # what the installed package alone runs


def code_files(folder):
    return {path.name for path in folder.glob("*.py")}


@pytest.mark.parametrize("head", sorted(HEAD_CASES))
def test_a_saved_folder_carries_the_runtime_of_its_heads_alone(head, remote_loads):
    """A saved folder carries what loading, forward and generate need (its folders load, run and
    generate in a process that cannot import the package: `test_remote_code_load_in_fresh_process`): its
    `head_catalog.py` imports the model's head classes alone (`mtp`'s shared head too), and the folder holds
    nothing the config and model files do not import, no tool (conversion, export, cards, FLOP counting, the
    GPU kernels); a `tied` folder at most 13 files."""
    from transformers.dynamic_module_utils import get_relative_import_files

    from hf_outheads import OutputHead

    root, _, _ = remote_loads
    folder = root / f"{head}-llama"
    files = code_files(folder)
    model = tiny_model("llama", head, HEAD_CASES[head])
    heads = {(cls.__module__.rsplit(".", 1)[-1], cls.__name__) for cls in map(type, model.head.modules())
             if issubclass(cls, OutputHead)}
    catalog = (folder / "head_catalog.py").read_text()
    assert set(re.findall(r"^from \.(head_\w+) import (\w+)$", catalog, re.M)) == heads, catalog
    entries = ("configuration_outheads.py", "modeling_outheads.py")
    needed = set(entries) | {Path(f).name for entry in entries for f in get_relative_import_files(folder / entry)}
    assert files == needed and not TOOL_FILES & files, sorted(files ^ needed)
    if head == "tied":
        assert len(files) <= 13, sorted(files)
    if head == "mtp":
        assert {"head_mtp.py", "head_tied.py"} <= files  # its shared head (`tied` in the contract case)


def test_a_save_over_an_earlier_one_drops_the_code_files_it_no_longer_writes(tmp_path):
    """A folder saved by an older version of the package carries all of it, tools included; a save over it keeps
    the runtime alone, and a file of the user's there stays."""
    for name in ("tools/conversion.py", "tools/model_card.py", "head_mos.py", "mixture.py"):
        (tmp_path / Path(name).name).write_text((PACKAGE / name).read_text())
    (tmp_path / "notes.py").write_text("# mine\n")
    tiny_model("llama", "tied").save_pretrained(tmp_path)
    files = code_files(tmp_path)
    assert "notes.py" in files and "head_tied.py" in files and not {"conversion.py", "model_card.py", "head_mos.py",
                                                                    "mixture.py"} & files, files


def test_remote_code_load_refuses_missing_head_weights(remote_loads):
    _, _, results = remote_loads
    error = results["missing-head-bias"].get("error", "")
    assert error.startswith("ValueError") and "head.bias" in error, results["missing-head-bias"]


def tool_imports(source: str) -> list[str]:
    """The modules of `hf_outheads.tools` and `hf_outheads.training` (what a saved folder does not carry) that
    the import statements of `source`, a file of `hf_outheads/`, name: anywhere in it, a function's too
    (transformers' remote code copies what those name, indented or not)."""
    named = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            named += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(filter(None, ("hf_outheads" if node.level == 1 else "", node.module)))
            named += [f"{base}.{alias.name}" for alias in node.names]
    return [name for name in named if f"{name}.".startswith(("hf_outheads.tools.", "hf_outheads.training."))]


def test_no_runtime_file_imports_a_tool_by_statement():
    """The runtime (the files of `hf_outheads/`) imports no training code and reaches the tools
    (`hf_outheads/tools/`) through `model_io.package_tool` alone: an import statement of a tool would make transformers copy it, and every
    package it imports, into a saved folder. The cli imports each command's module by statement, in its branch."""
    assert tool_imports("from .tools.conversion import convert_pretrained") == ["hf_outheads.tools.conversion.convert_pretrained"]
    assert tool_imports("from .training.flops import training_flops_per_step") == ["hf_outheads.training.flops.training_flops_per_step"]
    assert tool_imports("def f():\n    from .tools import folders\n") == ["hf_outheads.tools.folders"]
    assert tool_imports("import hf_outheads.training.flops\nfrom hf_outheads import tools") == [
        "hf_outheads.training.flops", "hf_outheads.tools"]
    assert tool_imports("from .head_catalog import get_head_class\nfrom . import losses\nimport tools") == []
    runtime = sorted(path.name for path in PACKAGE.glob("*.py"))
    assert {"model_io.py", "modeling_outheads.py", "losses.py"} <= set(runtime), runtime
    found = {name: named for name in runtime if (named := tool_imports((PACKAGE / name).read_text()))}
    assert not found, f"runtime files that import a tool by statement (use model_io.package_tool): {found}"
    cli = (PACKAGE / "tools" / "cli.py").read_text()
    assert "runpy" not in cli and "import_module" not in cli  # each command's module imported by statement
    assert [path.name for path in PACKAGE.rglob("*.py") if "runpy" in path.read_text()] == ["gguf_convert.py"]  # (it
    # runs llama.cpp's converter script as that script is)


def test_remote_code_needs_no_package_beyond_torch_and_transformers():
    """transformers refuses remote code whose modules import packages that are not installed:
    the saved files may only require what every transformers user has."""
    from pathlib import Path

    from transformers.dynamic_module_utils import get_imports

    package = Path(__import__("hf_outheads").__file__).parent
    required = {name for path in package.glob("*.py") for name in get_imports(str(path))} - sys.stdlib_module_names
    assert required <= {"__future__", "torch", "transformers", "numpy", "huggingface_hub", "safetensors"}, required
