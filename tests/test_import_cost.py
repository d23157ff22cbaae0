"""`import hf_outheads` imports no modelling code (transformers.modeling_utils costs more than
torch itself), nor scipy, accelerate or the pipelines; the model classes come on first use."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("scipy", "accelerate", "datasets", "transformers.modeling_utils", "transformers.pipelines",
         "hf_outheads.modeling_outheads")


def run(code: str) -> str:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout


def test_import_loads_no_modelling_code():
    out = run(f"import sys, hf_outheads; print([m for m in {HEAVY!r} if m in sys.modules])")
    assert out.strip() == "[]", out


def test_model_classes_come_on_first_use_and_are_registered():
    out = run("""
import hf_outheads
from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM, GPT2Config
config = hf_outheads.OutHeadsConfig(text_config=GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=40,
                                                           bos_token_id=0, eos_token_id=0), head_type="tied")
print(type(AutoModelForCausalLM.from_config(config)).__name__, hf_outheads.OutHeadsForSeq2SeqLM.__name__)
""")
    assert out.split() == ["OutHeadsForCausalLM", "OutHeadsForSeq2SeqLM"], out


def test_every_lazy_name_resolves_and_the_type_checkers_imports_name_the_same():
    """`hf_outheads.__init__` lists its names twice, as transformers' faces do: the name -> module map that
    `__getattr__` imports from, and the `TYPE_CHECKING` imports for type checkers; both must name the same
    objects, and each must be importable."""
    import ast
    import importlib

    import hf_outheads

    tree = ast.parse(Path(hf_outheads.__file__).read_text())
    guarded = next(node for node in tree.body if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING")
    typed = {alias.name: node.module for node in guarded.body for alias in node.names}
    assert typed == {name: module for name, module in hf_outheads._NAMES.items()}
    for name, module in hf_outheads._NAMES.items():
        assert getattr(hf_outheads, name) is getattr(importlib.import_module(f"hf_outheads.{module}"), name)
