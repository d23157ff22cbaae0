"""transformers' own model tests (`ModelTesterMixin`, `ConfigTester` of the installed version)
on a small matrix of wrapped backbones and heads: Llama and T5, `tied`, `drill`, `joint` and `mos`.

The tests are transformers' `tests/test_modeling_common.py` and `tests/test_configuration_common.py`
of the installed version: for 5.24.0 (the version CI runs the suite on) the copy in
tests/vendor/transformers_5_24_0 (Apache License 2.0, vendored unmodified), which runs offline; for
another version its source distribution, downloaded at test time (`pip download --no-deps
--no-binary :all: transformers==<version>`) into a cache folder; without it (no network, no pip)
the module is skipped, saying so (the `downloads` marker, tests/downloads.py: CI fails instead).

Adaptations, each for a reason that does not apply to a wrapper or to transformers' files:
  - the sdist ships `tests/` without its `generation/`, `exporters/` and `utils/` sub-packages,
    which `test_modeling_common` / `test_configuration_common` import: they are stubbed (the
    vendored copy's stubs, also put beside a downloaded version's files: `GenerationTesterMixin`,
    `ExportTesterMixin`: empty mixins, so generation and export are not run here; they are tested
    in test_generate.py and test_export.py; `config_common_kwargs`: transformers' own values);
  - `SKIPPED` below lists the tests that cannot apply, with the reason.

Out of scope by design: transformers' tests that take the output layer for an `nn.Linear` (or
None). `get_output_embeddings()` returns the head (an `OutputHead`): its scores are not `W h + b`
for most heads (a mixture, a label encoder, a code table), so an `nn.Linear` stand-in would let
code that multiplies by `lm_head.weight` (TRL's fused LM head, its distillation trainer) bypass the
head silently, and None would drop what libraries do with the output layer: PEFT's `all-linear`
and transformers' quantizers leave it out, TRL rejects adapters on it. Hence
`test_model_get_set_embeddings` is adapted (the head is returned) and
`test_resize_embeddings_untied` skipped (the head is resized by `head.resize_vocab`,
tests/test_resize.py).
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tarfile
import unittest
from pathlib import Path

import pytest
import torch
import transformers
from transformers import LlamaConfig, T5Config

from hf_outheads import OutHeadsConfig, OutHeadsForCausalLM, OutHeadsForSeq2SeqLM

VERSION = transformers.__version__
PACKAGE = "transformers_tests_" + VERSION.replace(".", "_")
VENDORED_VERSION = "5.24.0"
VENDORED = Path(__file__).resolve().parent / "vendor" / ("transformers_" + VENDORED_VERSION.replace(".", "_"))
STUBS = ("exporters", "generation", "utils")  # the sub-packages the sdist lacks, stubbed in the vendored copy
CACHE = Path(os.environ.get("HF_OUTHEADS_TEST_CACHE", Path.home() / ".cache" / "hf_outheads")) / f"transformers-{VERSION}"

# test name -> why it cannot apply to an OutHeads wrapper (or to the downloaded files)
SKIPPED = {
    "test_correct_missing_keys": "loads the bare backbone's checkpoint (a `llama` / `t5` config.json) into the "
                                 "wrapper class: refused by design, `from_backbone` converts a plain model",
    "test_resize_embeddings_untied": "reads `get_output_embeddings().weight`: the output layer is the head, resized "
                                     "with the embeddings by head.resize_vocab (tests/test_resize.py), and not every "
                                     "head has one `weight`",
    "test_generation_tester_mixin_inheritance": "GenerationTesterMixin is not in the sdist (stubbed); generation "
                                                "is tested in test_generate.py",
}


def transformers_tests_folder() -> Path:
    """The folder of transformers' test modules for the installed version: the vendored copy, or
    for another version its sdist's `tests/` (downloaded once) with the vendored stubs."""
    if VERSION == VENDORED_VERSION:
        return VENDORED
    package = CACHE / PACKAGE
    if (package / "test_modeling_common.py").exists():
        return package
    CACHE.mkdir(parents=True, exist_ok=True)
    archive = CACHE / f"transformers-{VERSION}.tar.gz"
    if not archive.exists():
        result = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                                 f"transformers=={VERSION}", "-d", str(CACHE), "-q"], capture_output=True, text=True)
        if result.returncode or not archive.exists():
            pytest.skip(f"cannot download transformers=={VERSION}'s source distribution: {result.stderr[-300:]}")
    prefix = f"transformers-{VERSION}/tests/"
    with tarfile.open(archive) as tar:
        for member in tar.getmembers():
            name = member.name
            if member.isfile() and name.startswith(prefix) and "/models/" not in name[len(prefix):]:
                member.name = name[len(prefix):]
                tar.extract(member, package, filter="data")
    (package / "__init__.py").touch()
    for stub in STUBS:
        shutil.copytree(VENDORED / stub, package / stub, dirs_exist_ok=True)
    return package


def load_common():
    pytest.importorskip("parameterized")
    package = transformers_tests_folder()
    if PACKAGE not in sys.modules:  # the folder as a package, loaded from its location
        spec = importlib.util.spec_from_file_location(PACKAGE, package / "__init__.py",
                                                      submodule_search_locations=[str(package)])
        sys.modules[PACKAGE] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[PACKAGE])
    return (importlib.import_module(f"{PACKAGE}.test_modeling_common"),
            importlib.import_module(f"{PACKAGE}.test_configuration_common"))


@pytest.fixture(scope="module")
def common():
    return load_common()


def text_config(backbone: str):
    if backbone == "llama":
        return LlamaConfig(hidden_size=32, intermediate_size=37, num_hidden_layers=2, num_attention_heads=4,
                           num_key_value_heads=2, vocab_size=99, max_position_embeddings=64, pad_token_id=0,
                           bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)
    return T5Config(d_model=32, d_ff=37, d_kv=8, num_layers=2, num_heads=4, vocab_size=99, decoder_start_token_id=0,
                    pad_token_id=0, eos_token_id=1)


class Tester:
    """transformers' `model_tester` for one wrapped backbone and head."""

    __test__ = False  # a helper, not a pytest test class

    batch_size, seq_length, vocab_size, hidden_size = 2, 7, 99, 32
    num_hidden_layers, num_attention_heads, is_training = 2, 4, True

    def __init__(self, parent, backbone: str, head: str):
        self.parent, self.backbone, self.head = parent, backbone, head
        self.encoder_seq_length = self.decoder_seq_length = self.seq_length

    def get_config(self):
        options = {"num_components": 2} if self.head == "mos" else {}
        return OutHeadsConfig(text_config=text_config(self.backbone), head_type=self.head, head_options=options)

    def prepare_config_and_inputs_for_common(self):
        ids = torch.randint(3, self.vocab_size, (self.batch_size, self.seq_length))
        inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
        if self.backbone == "t5":
            decoder = torch.randint(3, self.vocab_size, (self.batch_size, self.seq_length))
            inputs.update(decoder_input_ids=decoder, decoder_attention_mask=torch.ones_like(decoder))
        return self.get_config(), inputs


CASES = [("llama", "tied"), ("llama", "drill"), ("llama", "mos"), ("t5", "tied"), ("t5", "joint"), ("t5", "mos")]
pytestmark = [pytest.mark.filterwarnings("ignore::pytest.PytestUnknownMarkWarning")]  # transformers' own marks
if VERSION != VENDORED_VERSION:  # another version's tests come from its source distribution
    pytestmark.append(pytest.mark.downloads(f"transformers=={VERSION}'s source distribution from PyPI, for its tests"))


def run_suite(common, backbone, head):
    modeling, configuration = common
    model_class = OutHeadsForSeq2SeqLM if backbone == "t5" else OutHeadsForCausalLM

    class ModelTest(modeling.ModelTesterMixin, unittest.TestCase):
        all_model_classes = (model_class,)
        is_encoder_decoder = backbone == "t5"
        test_resize_embeddings = True

        def setUp(self):
            self.model_tester = Tester(self, backbone, head)
            # the backbone config as the composite serialises it (a diff against its defaults)
            serialized = json.loads(OutHeadsConfig(text_config=text_config(backbone), head_type=head).to_json_string())
            serialized = serialized["text_config"]
            self.config_tester = configuration.ConfigTester(self, config_class=OutHeadsConfig, text_config=serialized,
                                                            head_type=head, has_text_modality=False)

        def test_config(self):
            self.config_tester.run_common_tests()

        def _prepare_for_class(self, inputs_dict, model_class, return_labels=False):
            """Adaptation: transformers adds `labels` for its own classes by name (the Auto
            mappings' name lists), which cannot list the wrapper: add them here."""
            inputs = super()._prepare_for_class(inputs_dict, model_class, return_labels)
            if return_labels:
                ids = inputs["decoder_input_ids"] if "decoder_input_ids" in inputs else inputs["input_ids"]
                inputs["labels"] = ids.clone()
            return inputs

        def test_model_get_set_embeddings(self):
            """Adaptation: transformers expects `get_output_embeddings()` to be None or an
            nn.Linear; the wrapper's output layer is its head (an OutputHead, see
            `OutHeadsPreTrainedModel.get_output_embeddings`). The rest is transformers' test."""
            config, _ = self.model_tester.prepare_config_and_inputs_for_common()
            model = model_class(config)
            self.assertIsInstance(model.get_input_embeddings(), torch.nn.Embedding)
            new = torch.nn.Embedding(10, 10)
            model.set_input_embeddings(new)
            self.assertIs(model.get_input_embeddings(), new)
            self.assertIs(model.get_output_embeddings(), model.head)

    for name, reason in SKIPPED.items():
        if hasattr(ModelTest, name):
            setattr(ModelTest, name, unittest.skip(reason)(getattr(ModelTest, name)))
    suite = unittest.defaultTestLoader.loadTestsFromTestCase(ModelTest)
    result = unittest.TestResult()
    suite.run(result)
    return result


@pytest.mark.parametrize("backbone,head", CASES, ids=[f"{b}-{h}" for b, h in CASES])
def test_transformers_model_tests(common, backbone, head):
    result = run_suite(common, backbone, head)
    problems = [(test.id().rsplit(".", 1)[-1], trace.strip().splitlines()[-1][:300])
                for test, trace in result.failures + result.errors]
    assert result.testsRun > 50 and not problems, "\n".join(f"{name}: {last}" for name, last in problems)


def test_the_vendored_tests_are_of_a_version_the_package_allows():
    """The vendored copy is of a transformers version pyproject.toml allows (the one the suite runs on in CI), so
    the tests run there without a download; CI's floor run leaves this file out (.ci/run)."""
    import tomllib

    from packaging.specifiers import SpecifierSet

    root = Path(__file__).resolve().parents[1]
    requirement = next(dep for dep in tomllib.loads((root / "pyproject.toml").read_text())["project"]["dependencies"]
                       if dep.startswith("transformers"))
    assert VENDORED_VERSION in SpecifierSet(requirement.removeprefix("transformers")), (VENDORED_VERSION, requirement)
    assert "tests/test_transformers_common.py" not in (root / ".ci" / "run").read_text().split("floor=", 1)[1]
    assert f"from transformers {VENDORED_VERSION}'s source distribution" in (VENDORED / "test_modeling_common.py").read_text()
