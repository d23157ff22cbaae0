"""`push_to_hub` uploads weights, configs, code and a real model card, in one commit. Only
`HfApi.create_repo` / `HfApi.create_commit` are replaced; everything else runs for real."""

import os
from pathlib import Path

import pytest
import torch
from huggingface_hub import HfApi, ModelCard
from huggingface_hub.hf_api import RepoUrl
from transformers import AutoModelForCausalLM

import hf_outheads
from hf_outheads import HEAD_CLASSES, OutHeadsForCausalLM
from tiny import batch, tiny_model

# the runtime of a single-softmax head: what loading, forward and generate need
CODE_FILES = {"modeling_outheads.py", "configuration_outheads.py", "model_io.py", "head_interface.py",
              "head_options.py", "head_catalog.py", "backbones.py", "softmax.py", "losses.py", "loss_kernels.py",
              "logit_transforms.py", "compat.py"}
# the tools, which the installed package keeps
TOOL_FILES = {path.name for path in (Path(hf_outheads.__file__).parent / "tools").glob("*.py")} - {"__init__.py"}


@pytest.fixture
def fake_hub(monkeypatch):
    """Record each commit as {path_in_repo: bytes}."""
    commits = []

    def create_repo(self, repo_id, **kwargs):
        return RepoUrl(f"https://huggingface.co/{repo_id}")

    def create_commit(self, repo_id, operations, **kwargs):
        files = {}
        for op in operations:
            with open(op.path_or_fileobj, "rb") as handle:
                files[op.path_in_repo] = handle.read()
        commits.append({"repo_id": repo_id, "files": files, "message": kwargs.get("commit_message")})

    monkeypatch.setattr(HfApi, "create_repo", create_repo)
    monkeypatch.setattr(HfApi, "create_commit", create_commit)
    return commits


def head_file(head_type):
    return f"{HEAD_CLASSES[head_type].__module__.rsplit('.', 1)[-1]}.py"


def test_push_to_hub_uploads_everything_in_one_commit(fake_hub, tmp_path):
    """Weights, configs, the card and the code of the model's runtime alone: no tool, no other head."""
    model = tiny_model("gpt2", "bilinear")
    model.push_to_hub("someone/tiny-outheads", tags=["my-tag"])
    assert len(fake_hub) == 1 and fake_hub[0]["repo_id"] == "someone/tiny-outheads"
    files = fake_hub[0]["files"]
    expected = {"config.json", "model.safetensors", "generation_config.json", "README.md", head_file("bilinear")} | CODE_FILES
    assert expected <= set(files), expected - set(files)
    other_heads = {head_file(head) for head in HEAD_CLASSES if head != "bilinear"}
    assert not (TOOL_FILES | other_heads) & set(files), (TOOL_FILES | other_heads) & set(files)

    card = ModelCard(files["README.md"].decode())
    assert card.data.library_name == "transformers" and card.data.pipeline_tag == "text-generation"
    assert {"hf_outheads", "outheads-bilinear", "gpt2", "my-tag"} <= set(card.data.tags)
    assert 'AutoModelForCausalLM.from_pretrained("someone/tiny-outheads", trust_remote_code=True)' in card.text
    assert "This model card has been automatically generated" not in card.text  # transformers' stub is gone

    for name, content in files.items():  # what was uploaded loads back to the same model
        (tmp_path / name).write_bytes(content)
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        assert torch.equal(reloaded(**batch("gpt2")).logits, model(**batch("gpt2")).logits)


def test_save_pretrained_with_push_uses_the_card_too(fake_hub, tmp_path):
    """The card, and the code of the runtime alone, also through `save_pretrained(push_to_hub=True)`, which
    writes the folder in place; a file of the user's in that folder stays."""
    (tmp_path / "tiny-tied").mkdir()
    (tmp_path / "tiny-tied" / "notes.py").write_text("# mine\n")
    tiny_model("gpt2", "tied").save_pretrained(tmp_path / "tiny-tied", push_to_hub=True, repo_id="someone/tiny-tied")
    card = ModelCard(fake_hub[0]["files"]["README.md"].decode())
    assert "outheads-tied" in card.data.tags
    code = {name for name in fake_hub[0]["files"] if name.endswith(".py")}
    assert code == CODE_FILES | {head_file("tied")}, code  # (only files the save wrote are uploaded)
    assert (tmp_path / "tiny-tied" / "notes.py").read_text() == "# mine\n"


def test_model_card_describes_the_model():
    model = tiny_model("t5", "linear")
    card = model.create_model_card()
    assert isinstance(card, ModelCard)
    from transformers.pipelines import SUPPORTED_TASKS

    assert card.data.pipeline_tag in SUPPORTED_TASKS  # transformers 5 has no text2text-generation
    assert "`linear`" in card.text and "`t5`" in card.text and "s(h) = W h + b" in card.text
    assert "AutoModelForSeq2SeqLM.from_pretrained(" in card.text and "trust_remote_code=True" in card.text
    assert f"{sum(p.numel() for p in model.head.parameters()):,}" in card.text


def test_the_cards_usage_code_runs_without_the_package_and_without_a_prompt(tmp_path):
    """The code loaded the tokenizer without `trust_remote_code=True`; AutoTokenizer
    reads the folder's config (this package's model type) and stopped at transformers' interactive
    "run the custom code?" prompt. Run as it is, in a Python that never imports hf_outheads, it now
    generates without asking."""
    import re
    import subprocess
    import sys

    from tiny import word_tokenizer

    model = tiny_model("gpt2", "drill")
    model.save_pretrained(tmp_path)
    word_tokenizer().save_pretrained(tmp_path)
    code = re.search(r"## Usage\n\n```python\n(.*?)```", model.create_model_card(str(tmp_path)).text, re.S).group(1)
    code += '\nimport sys\nassert "hf_outheads" not in sys.modules and outputs.shape[1] > inputs["input_ids"].shape[1]\n'
    done = subprocess.run([sys.executable, "-c", code], stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=120, cwd=tmp_path, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Do you wish to run the custom code?" not in done.stdout + done.stderr, done.stdout[-2000:]


@pytest.mark.parametrize("head", ["drill", "doc"])
def test_model_card_lists_head_options(head):
    model = tiny_model("gpt2", head)
    card = model.create_model_card("someone/x")
    assert model.config.head_options
    for option, value in model.config.head_options.items():
        assert f'"{option}"' in card.text, option


def test_from_backbone_records_its_origin_as_base_model(tmp_path):
    from tiny import tiny_original

    original = tiny_original("gpt2")
    original.name_or_path = "openai-community/gpt2"  # as from_pretrained("openai-community/gpt2") sets it
    converted = OutHeadsForCausalLM.from_backbone(original, "mos", {"num_components": 2})
    assert converted.config.base_model == "openai-community/gpt2"
    card = converted.create_model_card("someone/gpt2-mos")
    assert card.data.base_model == "openai-community/gpt2" and "`openai-community/gpt2`" in card.text
    assert {"outheads-mos", "arxiv:1711.03953"} <= set(card.data.tags)

    converted.save_pretrained(tmp_path / "converted")  # kept in config.json
    assert AutoModelForCausalLM.from_pretrained(tmp_path / "converted").config.base_model == "openai-community/gpt2"
    original.save_pretrained(tmp_path / "plain")  # a local folder: recorded, but no card metadata
    local = OutHeadsForCausalLM.from_backbone(str(tmp_path / "plain"))
    assert local.config.base_model == str(tmp_path / "plain")
    assert local.create_model_card().data.base_model is None


def test_trainer_push_to_hub_card_describes_the_head(fake_hub, tmp_path, monkeypatch):
    """`Trainer.push_to_hub` writes its own README (transformers' TrainingSummary); the model's
    `model_tags` put the package, the head and its papers in it."""
    from transformers import Trainer, TrainingArguments

    def upload_folder(self, repo_id, folder_path, **kwargs):  # record the folder Trainer uploads
        fake_hub.append({"repo_id": repo_id, "files": {p.name: p.read_bytes() for p in Path(folder_path).iterdir()
                                                       if p.is_file() and not p.name.startswith("_")}})

    monkeypatch.setattr(HfApi, "upload_folder", upload_folder)

    model = tiny_model("gpt2", "drill")
    args = TrainingArguments(output_dir=str(tmp_path / "run"), hub_model_id="someone/tiny-drill", report_to=[],
                             use_cpu=True, save_strategy="no")
    Trainer(model=model, args=args).push_to_hub()
    files = fake_hub[-1]["files"]
    card = ModelCard(files["README.md"].decode())
    assert {"hf_outheads", "outheads-drill", "gpt2", "arxiv:1905.05513"} <= set(card.data.tags)
    assert "modeling_outheads.py" in files and "head_drill.py" in files


def test_from_backbone_of_a_model_loaded_from_the_hub_records_its_id(tmp_path):
    """A model object from `from_pretrained("<hub id>")` (here from a Hub cache laid out as
    huggingface_hub writes it, offline): its `config._name_or_path` becomes the card's base_model."""
    from tiny import tiny_original

    snapshot = tmp_path / "models--someone--gpt2" / "snapshots" / ("a" * 40)
    tiny_original("gpt2").save_pretrained(snapshot)
    (tmp_path / "models--someone--gpt2" / "refs").mkdir()
    (tmp_path / "models--someone--gpt2" / "refs" / "main").write_text("a" * 40)
    loaded = AutoModelForCausalLM.from_pretrained("someone/gpt2", cache_dir=tmp_path, local_files_only=True)
    assert loaded.config._name_or_path == "someone/gpt2"
    converted = OutHeadsForCausalLM.from_backbone(loaded, "tied")
    assert converted.create_model_card().data.base_model == "someone/gpt2"
