"""The training helpers in process (fast): options, tokenizers, data errors, the built-in
corpus, metric modules, the model card, publishing with a faked Hub, the comparison script."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from datasets import Dataset, DatasetDict
from huggingface_hub import CommitOperationAdd, HfApi, ModelCard
from transformers import GPT2Config

from hf_outheads import HEAD_CLASSES, OutHeadsConfig, OutHeadsForCausalLM
from hf_outheads.training import data as data_lib
from hf_outheads.training.evaluation import generation_scores
from hf_outheads.training.options import FIELDS, GROUPS, RunOptions, parse_options
from hf_outheads.training.publish import push_to_hub, render_card
from hf_outheads.training.corpora.stdlib import SAFE_MODULES, build_records, build_records_isolated, restore_records
from hf_outheads.training.tokenization import train_tokenizer

TEXTS = [r["text"] for r in build_records("text")["train"][:400]]


def test_every_option_has_help_and_unknown_keys_list_the_valid_ones(tmp_path):
    assert all(spec.help for group in GROUPS.values() for spec in group.declarations().values())
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({"task": "causal_lm", "lerning_rate": 0.1}))
    with pytest.raises(ValueError, match=r"Unknown option\(s\) \['lerning_rate'\].*Valid options: task, "):
        parse_options(["--config", str(config)])
    with pytest.raises(SystemExit, match=r"Unknown option\(s\) \['--max_step'\].*max_steps"):
        parse_options(["--max_step", "3"])
    with pytest.raises(ValueError, match=r"task='lm' is not one of"):
        parse_options(["--task", "lm"])


def test_yaml_values_are_overridden_by_typed_command_line_values(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({"max_steps": 5, "head_type": "bilinear", "learning_rate": 0.1}))
    options = parse_options(["--config", str(config), "--max_steps", "7", "--head_options", "{map_scale: 0.5}",
                             "--gradient_checkpointing", "true", "--sample_prompt", "123", "--warmup_steps", "3",
                             "--dropout", "1e-1"])
    assert (options.training.max_steps, options.model.head_type, options.training.learning_rate) == (7, "bilinear", 0.1)
    assert options.model.head_options == {"map_scale": 0.5} and options.training.gradient_checkpointing is True
    assert options.training.sample_prompt == "123"  # string options stay strings
    assert options.model.dropout == 0.1 and options.training.warmup_steps == 3  # YAML reads 1e-1 as a string


@pytest.mark.parametrize("vocab_size", [300, 700])
def test_bpe_tokenizer_has_the_requested_size_and_round_trips(vocab_size):
    tokenizer = train_tokenizer(TEXTS, "bpe", vocab_size, min_frequency=2)
    assert len(tokenizer) == vocab_size
    text = "os.path.join(a, *p)\n  Join two paths — ünïcode ✓ 0x1F"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(ids) == text
    assert tokenizer.eos_token == "</s>" and tokenizer.pad_token_id is not None


def test_wordlevel_tokenizer_has_the_requested_size_and_round_trips_known_words():
    tokenizer = train_tokenizer(TEXTS, "wordlevel", 200, min_frequency=1)
    assert len(tokenizer) == 200
    text = "Return the value of the"
    assert tokenizer.decode(tokenizer(text, add_special_tokens=False)["input_ids"]) == text
    rare = tokenizer("zyzzyva", add_special_tokens=False)["input_ids"]
    assert rare == [tokenizer.unk_token_id]


def test_bpe_asks_for_more_codes_than_the_text_supports_is_an_error():
    with pytest.raises(ValueError, match="fewer than the requested"):
        train_tokenizer(["tiny text"] * 3, "bpe", 5000)


def options(**values):
    return RunOptions.from_flat(values)


def test_missing_column_and_empty_split_are_clear_errors():
    raw = DatasetDict({"train": Dataset.from_dict({"content": ["a b c"] * 4}),
                       "validation": Dataset.from_dict({"content": []})})
    opts = options(text_column="text", validation_split="test")
    with pytest.raises(ValueError, match=r"Column\(s\) \['text'\] not found; the dataset has \['content'\]"):
        data_lib.select_splits(raw, opts)  # checked when the splits are chosen, before any tokenizer
    train, validation = data_lib.select_splits(raw, options(text_column="content", validation_split="test"))
    assert len(train) + len(validation) == 4  # no 'test' split: 5% of train held out
    with pytest.raises(ValueError, match=r"Column\(s\) \['text'\] not found; the dataset has \['content'\]"):
        data_lib.causal_lm_dataset(train, None, opts)
    with pytest.raises(ValueError, match="Split 'validation' is empty"):
        data_lib.select_splits(raw, options(text_column="content"))
    with pytest.raises(ValueError, match="no split 'training'"):
        data_lib.select_splits(raw, options(train_split="training"))
    pairs = Dataset.from_dict({"translation": [{"de": "hallo", "en": "hello"}]})
    with pytest.raises(ValueError, match=r"\['source', 'target'\] not found"):
        data_lib.seq2seq_dataset(pairs, None, options(task="seq2seq"))


def test_causal_lm_blocks_and_seq2seq_pairs_from_local_files(tmp_path):
    tokenizer = train_tokenizer(TEXTS, "bpe", 300)
    (tmp_path / "train.txt").write_text("\n".join(TEXTS[:50]))
    (tmp_path / "pairs.jsonl").write_text("".join(json.dumps({"translation": {"de": "Hallo Welt", "en": "Hello world"}}) + "\n" for _ in range(3)))
    raw = data_lib.load_raw(options(data_files={"train": str(tmp_path / "train.txt")}))
    blocks = data_lib.causal_lm_dataset(raw["train"], tokenizer, options(block_size=16, preprocessing_num_workers=2))
    assert len(blocks) > 10 and all(len(ids) == 16 for ids in blocks["input_ids"]) and blocks["labels"] == blocks["input_ids"]
    streamed = data_lib.load_raw(options(data_files={"train": str(tmp_path / "train.txt")}, streaming=True, max_steps=1))
    streamed_blocks = list(data_lib.causal_lm_dataset(streamed["train"], tokenizer, options(block_size=16)))
    in_memory = data_lib.causal_lm_dataset(raw["train"], tokenizer, options(block_size=16))
    assert [b["input_ids"] for b in streamed_blocks] == list(in_memory["input_ids"])  # same blocks, never materialised
    pairs = data_lib.load_raw(options(data_files={"train": str(tmp_path / "pairs.jsonl")}))["train"]
    encoded = data_lib.seq2seq_dataset(pairs, tokenizer, options(task="seq2seq", source_lang="de", target_lang="en",
                                                                 source_prefix="translate: "))
    assert tokenizer.decode(encoded[0]["input_ids"], skip_special_tokens=True) == "translate: Hallo Welt"
    assert encoded[0]["labels"][-1] == tokenizer.eos_token_id


def test_word_counts_count_the_predicted_tokens():
    split = Dataset.from_dict({"input_ids": [[5, 6], [7]], "labels": [[1, 2, 2], [-100, 3]]})
    assert data_lib.word_counts(split, 5).tolist() == [0, 1, 2, 1, 0]


def test_stdlib_corpus_is_deterministic_and_imports_only_safe_modules():
    assert not {"turtle", "tkinter", "idlelib", "antigravity", "this", "webbrowser"} & set(SAFE_MODULES)
    first, again = build_records_isolated("summary"), build_records_isolated("summary")
    assert first == again and len(first["train"]) > 1000 and len(first["validation"]) > 100
    sources = {r["source"] for r in first["train"]}
    assert not sources & {r["source"] for r in first["validation"]}
    assert all(" at 0x" not in r["source"] for r in first["train"])  # no memory addresses in signatures


def test_stdlib_restore_pairs_join_wrapped_lines_and_keep_each_sentence_once():
    records = {"train": [{"text": "m.f(x)\nReturn the value of x,\nrounded.  Too short here.\n\nSee the M.g function, please, for more."},
                         {"text": "m.h()\nReturn the value of x, rounded."}],
               "validation": [{"text": "m.k()\nReturn the value of x,\nrounded."}]}
    splits = restore_records(records)
    assert splits["train"] == [{"source": "return the value of x rounded", "target": "Return the value of x, rounded."},
                               {"source": "see the m g function please for more",
                                "target": "See the M.g function, please, for more."}]
    assert splits["validation"] == []  # the same sentence in another split would leak
    short = restore_records(records, max_words=6)  # a 7-word sentence is dropped
    assert [pair["target"] for pair in short["train"]] == ["Return the value of x, rounded."]


def test_stdlib_restore_short_is_restore_without_the_long_sentences():
    from hf_outheads.training.corpora.stdlib import RESTORE_MAX_WORDS, TASKS

    assert RESTORE_MAX_WORDS == {"restore": 30, "restore_short": 16} and set(RESTORE_MAX_WORDS) <= set(TASKS)
    text = build_records_isolated("text")
    full, short = restore_records(text), restore_records(text, RESTORE_MAX_WORDS["restore_short"])
    for split in ("train", "validation"):
        assert short[split] == [pair for pair in full[split] if len(pair["target"].split()) <= 16]
    assert len(short["train"]) > 2000 and len(short["validation"]) > 200  # enough for the quickstart


def test_metric_modules_load_offline():
    scores = generation_scores(["sacrebleu", "chrf", "rouge"], ["the cat sat on the mat"], ["the cat sat on the mat"])
    assert scores["eval_sacrebleu"] == pytest.approx(100.0) and scores["eval_chrf"] == pytest.approx(100.0)
    assert scores["eval_rouge1"] == pytest.approx(100.0)  # every score on the 0-100 scale


def tiny_model(tmp_path):
    config = OutHeadsConfig(text_config=GPT2Config(n_embd=16, n_layer=1, n_head=2, vocab_size=300, n_positions=32),
                            head_type="bilinear")
    tokenizer = train_tokenizer(TEXTS, "bpe", 300)
    return OutHeadsForCausalLM(config), tokenizer


def test_card_renders_offline_with_model_index_and_bibtex(tmp_path):
    model, tokenizer = tiny_model(tmp_path)
    opts = options(model_preset="gpt2-tiny", head_type="bilinear", dataset_name="wikitext", dataset_config="wikitext-2-raw-v1")
    results = {"eval_perplexity": 123.456789, "eval_loss": 4.8, "parameters": 10, "head_parameters": 2,
               "eval_examples": 3, "eval_tokens": 30, "sample": "Return the"}
    card = render_card(model, tokenizer, opts, results, tmp_path)
    card.save(tmp_path / "README.md")
    parsed = ModelCard.load(tmp_path / "README.md")
    assert parsed.data.datasets == ["wikitext"] and parsed.data.eval_results[0].metric_value == pytest.approx(123.4568)
    assert "gulordava-etal-2018-colorless" in parsed.text and "AutoModelForCausalLM" in parsed.text


def test_push_to_hub_uploads_the_card_after_the_model(tmp_path, monkeypatch):
    model, tokenizer = tiny_model(tmp_path)
    (tmp_path / "README.md").write_text("---\nlicense: apache-2.0\n---\n# our card\n")
    commits = []

    def create_commit(self, repo_id, operations, commit_message=None, **kwargs):
        files = {}
        for op in operations:
            if isinstance(op, CommitOperationAdd):
                source = op.path_or_fileobj
                files[op.path_in_repo] = Path(source).read_bytes() if isinstance(source, (str, Path)) else bytes(source.read() if hasattr(source, "read") else source)
        commits.append(files)
        return SimpleNamespace(oid="0" * 40, commit_url="", pr_url=None, repo_url=SimpleNamespace(repo_id=repo_id))

    monkeypatch.setattr(HfApi, "create_repo", lambda self, repo_id, **kwargs: SimpleNamespace(repo_id=repo_id))
    monkeypatch.setattr(HfApi, "create_commit", create_commit)
    monkeypatch.setenv("HF_TOKEN", "hf_fake_token_for_offline_test")
    push_to_hub(model, tokenizer, tmp_path, "someone/tiny")
    uploaded = [name for files in commits for name in files]
    assert "model.safetensors" in uploaded and "tokenizer.json" in uploaded
    last_readme = max(i for i, files in enumerate(commits) if "README.md" in files)
    assert commits[last_readme]["README.md"] == (tmp_path / "README.md").read_bytes()
    assert last_readme > max(i for i, files in enumerate(commits) if "model.safetensors" in files)


def test_the_cards_usage_code_loads_the_absolute_folder_or_the_pushed_repository(tmp_path, monkeypatch):
    """A run's card loads its folder by absolute path (`--output_dir run` given relative would be
    taken for a Hub id from any other folder) or, pushed without `hub_model_id`, the repository the Hub
    made: the folder's name in the user's namespace."""
    from hf_outheads.training.publish import finish_run

    model, tokenizer = tiny_model(tmp_path)
    results = {"eval_perplexity": 9.0, "eval_loss": 2.2, "parameters": 10, "head_parameters": 2, "eval_examples": 3,
               "eval_tokens": 30, "sample": "Return the", "sample_prompt": "Return the"}
    monkeypatch.chdir(tmp_path)
    finish_run(model, tokenizer, options(model_preset="gpt2-tiny", head_type="bilinear", output_dir="run"), results)
    assert f'from_pretrained("{tmp_path.resolve() / "run"}")' in (tmp_path / "run" / "README.md").read_text()
    # not pushed, with the repository it will be uploaded to: the card as it will be pushed
    finish_run(model, tokenizer, options(model_preset="gpt2-tiny", head_type="bilinear", output_dir="later",
                                         hub_model_id="someone/later"), results)
    assert 'from_pretrained("someone/later")' in (tmp_path / "later" / "README.md").read_text()

    commits, made = [], []

    def create_commit(self, repo_id, operations, commit_message=None, **kwargs):
        commits.append({op.path_in_repo: Path(op.path_or_fileobj).read_bytes() for op in operations
                        if isinstance(op, CommitOperationAdd) and isinstance(op.path_or_fileobj, (str, Path))})
        return SimpleNamespace(oid="0" * 40, commit_url="", pr_url=None, repo_url=SimpleNamespace(repo_id=repo_id))

    def create_repo(self, repo_id, **kwargs):  # as the Hub does: a bare name goes to the user's namespace
        made.append(repo_id)
        return SimpleNamespace(repo_id=repo_id if "/" in repo_id else f"someone/{repo_id}")

    monkeypatch.setattr(HfApi, "create_repo", create_repo)
    monkeypatch.setattr(HfApi, "create_commit", create_commit)
    monkeypatch.setenv("HF_TOKEN", "hf_fake_token_for_offline_test")
    finish_run(model, tokenizer, options(model_preset="gpt2-tiny", head_type="bilinear", output_dir="pushed",
                                         push_to_hub=True), results)
    card = [files["README.md"] for files in commits if "README.md" in files][-1].decode()
    assert made[0] == "pushed" and 'from_pretrained("someone/pushed")' in card and str(tmp_path) not in card


def test_heads_that_update_periodically_get_their_hook_and_the_others_none():
    import torch
    from accelerate import Accelerator

    from hf_outheads.training.run import periodic_update_hook

    learners = [name for name, cls in HEAD_CLASSES.items() if cls.updates_periodically]
    assert learners == ["lightrnn"]
    accelerator = Accelerator(cpu=True)
    for name in learners:
        config = OutHeadsConfig(text_config=GPT2Config(n_embd=16, n_layer=1, n_head=2, vocab_size=50, n_positions=16),
                                head_type=name)
        model = OutHeadsForCausalLM(config).train()
        every, hook = periodic_update_hook(accelerator, model, options(eval_steps=7))
        assert every == 7
        ids = torch.randint(0, 50, (2, 8))
        model(input_ids=ids, labels=ids).loss.backward()
        result = hook()  # costs summed over processes with accelerator.reduce (one process here)
        assert result["code_tokens"] > 0 and "code_moved" in result
        model.head.track_code_costs(False)
        assert periodic_update_hook(accelerator, model, options(eval_steps=7, code_reassign_steps=0)) == (None, None)
        assert not model.head.tracking_code_costs  # a fixed table: no costs accumulated
    plain = OutHeadsForCausalLM(OutHeadsConfig(text_config=GPT2Config(n_embd=16, n_layer=1, n_head=2, vocab_size=50),
                                               head_type="tied"))
    assert periodic_update_hook(accelerator, plain, options(eval_steps=7)) == (None, None)
    assert plain.head.periodic_update() == {}  # the interface's no-op default


def test_pretrained_checkpoint_is_converted_with_the_configured_head(tmp_path):
    import torch
    from transformers import GPT2LMHeadModel

    from hf_outheads.training.modeling import build_model, check_backbone
    from hf_outheads.training.tokenization import load_pretrained_tokenizer

    tokenizer = train_tokenizer(TEXTS, "bpe", 300)
    original = GPT2LMHeadModel(GPT2Config(n_embd=16, n_layer=1, n_head=2, vocab_size=300, n_positions=32)).eval()
    original.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    opts = options(pretrained=str(tmp_path), head_type="bilinear", tokenizer="auto", dropout=0.0, block_size=32)
    model = build_model(opts, load_pretrained_tokenizer(str(tmp_path))).eval()
    assert model.config.head_type == "bilinear" and model.config.text_config.resid_pdrop == 0.0
    ids = torch.randint(0, 300, (1, 6))
    torch.testing.assert_close(model(input_ids=ids).logits, original(input_ids=ids).logits)  # tied original: exact
    with pytest.raises(ValueError, match="exactly one of model_preset"):  # by the preflight: build_model relies on it
        check_backbone(options(pretrained=str(tmp_path), model_preset="gpt2-tiny"))


SHIPPED_CONFIGS = sorted(path for folder in ("hf_outheads/training/configs", "studies/configs")
                         for path in (Path(__file__).resolve().parents[1] / folder).glob("*.yaml"))


@pytest.mark.parametrize("config", SHIPPED_CONFIGS, ids=lambda p: p.name)
def test_shipped_configs_parse_and_name_valid_head_options(config):
    from hf_outheads.training.options import head_spec

    if config.name.startswith("scale_"):  # studies/scale_heads.py's own options, its variants by the same rule
        variants = yaml.safe_load(config.read_text())["head_options_by_head"]
        assert variants and {head_spec(name, variants).head_type for name in variants} <= set(HEAD_CLASSES)
        return
    opts = parse_options(["--config", str(config)])  # checks the chosen head's options
    for name in opts.model.head_options_by_head:  # every variant compare_heads.py may run from it
        opts.model.head_spec(name)  # a misspelt head, option name or a wrong-typed value is an error


QUICKSTART_LM = Path(__file__).resolve().parents[1] / "hf_outheads" / "training" / "configs" / "quickstart_lm.yaml"


def test_a_runs_head_options_are_checked_once_and_carried_to_the_model(tmp_path, monkeypatch):
    """From the command line to the head, a run builds its head's options object once, checked when
    the options are parsed (`ModelOptions.head`), and each config built resolves that object once for
    its sizes, without checking it again: the preflight's (a preset's config, `check_preset_model`,
    which builds no model) and the run's model's, whose head reads the resolved object as it is."""
    from hf_outheads.head_mos import MoSOptions
    from hf_outheads.training.modeling import build_model
    from hf_outheads.training.preflight import check_run

    built, resolved, check, resolve = [], [], MoSOptions.__post_init__, MoSOptions.resolve
    monkeypatch.setattr(MoSOptions, "__post_init__", lambda self: (built.append(self), check(self))[1])
    monkeypatch.setattr(MoSOptions, "resolve", lambda self, dims: resolved.append(resolve(self, dims)) or resolved[-1])
    opts = parse_options(["--config", str(QUICKSTART_LM), "--head_type", "mos", "--head_options", "{num_components: 2}",
                          "--output_dir", str(tmp_path)])
    check_run(opts)
    model = build_model(opts, train_tokenizer(TEXTS, "bpe", 300))
    assert built == [opts.model.head.options] and built[0] is opts.model.head.options  # checked once, when parsed
    assert (built[0].num_components, built[0].map_scale) == (2, None)  # as given: defaults come with the sizes
    assert len(resolved) == 2 and model.head.options is resolved[1]  # the preflight's config, and the run's model's
    assert (resolved[1].num_components, resolved[1].map_scale, resolved[1].resolved_for) == (2, 0.01, model.head.dims)
    assert resolved[0] == resolved[1]  # the preflight's model: the same options for the same sizes


def test_a_backbone_flag_takes_the_place_of_the_configs():
    """--pretrained replaces the config's preset (and the tokenizer trained for it: a trained
    BPE cannot fit a pretrained model's embeddings); --model_preset replaces a config's pretrained."""
    opts = parse_options(["--config", str(QUICKSTART_LM), "--pretrained", "outputs/quickstart_lm"])
    assert (opts.model.model_preset, opts.model.pretrained, opts.model.tokenizer) == (None, "outputs/quickstart_lm", "auto")
    opts = parse_options(["--config", str(QUICKSTART_LM), "--pretrained", "x/y", "--tokenizer", "wordlevel"])
    assert (opts.model.model_preset, opts.model.tokenizer) == (None, "wordlevel")  # a given --tokenizer is kept
    assert parse_options(["--config", str(QUICKSTART_LM)]).model.model_preset == "gpt2-tiny"


def foreign_checkpoint(output_dir: Path, head_type: str = "tied") -> Path:
    """A complete checkpoint (checkpoint.json is what marks one) of a tiny GPT-2 with `head_type`."""
    from hf_outheads.training.checkpoints import MARKER, model_identity

    folder = output_dir / "checkpoints" / "checkpoint_400"
    folder.mkdir(parents=True)
    model = OutHeadsForCausalLM(OutHeadsConfig(text_config=GPT2Config(n_embd=16, n_layer=1, n_head=2, vocab_size=50),
                                               head_type=head_type))
    progress = {"step": 400, "epoch": 3, "batches_in_epoch": 0}
    (folder / MARKER).write_text(json.dumps({"format": 1, "progress": progress, "model": model_identity(model)}))
    return folder


def test_wrong_run_options_fail_when_parsed_with_one_message(tmp_path):
    """Decided before any data is built: a checkpoint of another head in output_dir, and a
    backbone that does not fit; the script prints one line and exits non-zero, no traceback."""
    import subprocess
    import sys

    from hf_outheads.training.train import parse_args

    checkpoint = foreign_checkpoint(tmp_path)
    base = ["--config", str(QUICKSTART_LM), "--output_dir", str(tmp_path)]
    with pytest.raises(SystemExit) as error:
        parse_args([*base, "--head_type", "mos"])
    message = str(error.value)
    assert error.value.code == 2  # a usage error's status, as argparse's
    assert f"The checkpoint {checkpoint} belongs to another model" in message
    assert "head 'tied' on a gpt2 backbone" in message and "head 'mos' on a gpt2 backbone" in message
    assert "--resume never" in message
    assert parse_args([*base, "--head_type", "tied"]).model.head_type == "tied"  # its own checkpoint: resumed
    assert parse_args([*base, "--head_type", "mos", "--resume", "never"]).model.head_type == "mos"
    with pytest.raises(SystemExit, match=r"Preset bart-tiny \(bart\) does not fit task=causal_lm"):
        parse_args([*base, "--model_preset", "bart-tiny"])
    with pytest.raises(SystemExit, match="tokenizer: auto needs a pretrained model"):
        parse_args([*base, "--tokenizer", "auto"])
    done = subprocess.run([sys.executable, "-m", "hf_outheads.training.train", *base, "--head_type", "mos"], capture_output=True,
                          text=True, timeout=120, cwd=Path(__file__).resolve().parents[1],
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert done.stderr.strip().splitlines()[-1].startswith("train.py: error: The checkpoint"), done.stderr[-2000:]


def test_a_wrong_typed_head_option_fails_in_one_line_before_anything_is_written(tmp_path):
    """`--head_options '{depth: two}'` is refused when the options are parsed: one line on stderr,
    a non-zero exit status, and no output folder (no corpus read, no tokenizer trained)."""
    import subprocess
    import sys

    output_dir = tmp_path / "out"
    command = [sys.executable, "-m", "hf_outheads.training.train", "--config", str(QUICKSTART_LM), "--output_dir", str(output_dir),
               "--head_type", "drill", "--head_options", "{depth: two}"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=Path(__file__).resolve().parents[1],
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 2, done.stderr[-2000:]  # argparse's status for a usage error
    assert done.stderr.strip().splitlines() == [
        "train.py: error: Head 'drill': option 'depth' must be an integer >= 0, got 'two'."], done.stderr[-2000:]
    assert not output_dir.exists()


def test_the_cards_usage_code_generates_the_cards_sample(tmp_path, capsys):
    """The card's code, run as it is on the saved folder, prints the card's sample (the same
    prompt, seed and sampling settings); the card uses hf_outheads' tags and no local base_model."""
    import contextlib
    import io
    import re

    from hf_outheads.training.evaluation import sample_text
    from hf_outheads.training.publish import finish_run

    model, tokenizer = tiny_model(tmp_path)
    model.config.base_model = str(tmp_path)  # converted from a local folder: no card metadata
    model.generation_config.pad_token_id = tokenizer.pad_token_id  # as train.py sets it
    opts = options(model_preset="gpt2-tiny", head_type="bilinear", dataset_name="stdlib_docstrings", dataset_config="text",
                   output_dir=str(tmp_path / "run"), sample_max_new_tokens=12, seed=7)
    sample = sample_text(model, tokenizer, "Return the", opts.training.sample_max_new_tokens, opts.training.seed)
    results = {"eval_perplexity": 9.0, "eval_loss": 2.2, "parameters": 10, "head_parameters": 2, "eval_examples": 3,
               "eval_tokens": 30, "sample": sample, "sample_prompt": "Return the"}
    finish_run(model, tokenizer, opts, results)
    card = ModelCard.load(tmp_path / "run" / "README.md")
    code = re.search(r"## Usage\n\n```python\n(.*?)```", card.text, re.S).group(1)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(code, {})
    assert printed.getvalue().strip() == sample.strip() and f"```text\n{sample}\n```" in card.text
    assert {"hf_outheads", "outheads-bilinear", "gpt2"} <= set(card.data.tags)
    assert not any(tag.startswith("output-head-") for tag in card.data.tags)
    assert card.data.base_model is None  # never a local path


def test_card_prose_of_every_built_in_task_reads():
    from hf_outheads.training.publish import dataset_description

    for config, task in (("text", "causal_lm"), ("summary", "seq2seq"), ("restore", "seq2seq"), ("restore_short", "seq2seq")):
        prose = dataset_description(options(dataset_name="stdlib_docstrings", dataset_config=config, task=task))[1]
        assert "Python standard library" in prose and " for of " not in prose and prose.endswith(".")
    for name, config, module in (("debian_manpages", "restore", "hf_outheads.training.corpora.manpages"),
                                 ("debian_manpages_l10n", "fr-en", "hf_outheads.training.corpora.manpages_l10n")):
        prose = dataset_description(options(dataset_name=name, dataset_config=config, task="seq2seq"))[1]
        assert f"`{module}`, config `{config}`" in prose and "Debian" in prose and "Hub" not in prose, prose


def test_option_table_and_help_are_current():
    options_page = (Path(__file__).resolve().parents[1] / "docs" / "options.md").read_text()
    table = options_page[options_page.index("## The groups"):]
    assert [name for name in FIELDS if f"`{name}`" not in table] == []  # every option is documented
    assert "papers' defaults" not in GROUPS["model"].declarations()["head_options"].help  # they were chosen by measurement


def test_the_options_named_as_trainers_and_trls_are_listed_and_are_theirs():
    """docs/options.md lists the options that carry a `TrainingArguments`, TRL `ModelConfig` or `ScriptArguments`
    name: each listed one is a field of that class, and every option that is such a field is listed."""
    import dataclasses
    import re

    trl = pytest.importorskip("trl")
    from transformers import TrainingArguments

    page = (Path(__file__).resolve().parents[1] / "docs" / "options.md").read_text()
    section = page[page.index("## Names shared with Trainer and TRL"):page.index("## Trackers")]
    trainer_part, model_part, script_part = re.split(r"These are TRL's `ModelConfig` names:|and TRL's `ScriptArguments`:",
                                                     section)
    for part, cls in ((trainer_part, TrainingArguments), (model_part, trl.ModelConfig), (script_part, trl.ScriptArguments)):
        listed = set(re.findall(r"`(\w+)`", part)) - {"TrainingArguments"}
        theirs = {f.name for f in dataclasses.fields(cls)} & set(FIELDS)
        assert listed == theirs, (cls.__name__, listed ^ theirs)


def test_the_documented_two_process_command_trains_in_a_folder_of_its_own():
    """In the quickstart's folder it would resume the finished quickstart run and train nothing."""
    import re

    readme = (Path(__file__).resolve().parents[1] / "training" / "README.md").read_text()
    command = re.search(r"accelerate launch --multi_gpu --num_processes 2 hf_outheads/training/train.py (?:[^\n\\]|\\\n)*", readme).group(0)
    folder = re.search(r"--output_dir (\S+)", command)
    assert folder and folder.group(1) != yaml.safe_load(QUICKSTART_LM.read_text())["output_dir"], command


def test_scripts_run_as_modules_and_documented_commands_say_so():
    """No script edits sys.path for its own imports: the training scripts run by path through the installed
    package (`hf_outheads/training/train.py`: tests/test_commands.py), every other script as `python -m
    package.module` from the repository root, and every command the READMEs, configs and docstrings give is
    written that way. (`hf-outheads gguf` puts a llama.cpp tree on sys.path: its converter imports its own
    `conversion` package from there.)"""
    import re

    root = Path(__file__).resolve().parents[1]
    sources = [p for folder in ("studies", "benchmarks", "hf_outheads", "examples", "tests")
               for p in (root / folder).rglob("*.py")]
    assert [str(p) for p in sources if "sys.path" in p.read_text()
            and p.name not in (Path(__file__).name, "gguf_convert.py")] == []
    by_path = re.compile(r"(?:python|\$PY|accelerate launch|torchrun)[^\n`]*?\b(?:studies|benchmarks)/\w+\.py")
    documents = [*sources, *root.glob("*.md"), *(root / "training").rglob("*.md"), *(root / "studies").glob("*.md"),
                 *(root / "benchmarks").glob("*.sh"),
                 *(root / "hf_outheads" / "training" / "configs").glob("*.yaml"), *(root / "studies" / "configs").glob("*.yaml")]
    assert {str(p.relative_to(root)): by_path.findall(p.read_text()) for p in documents
            if by_path.search(p.read_text()) and p.name != Path(__file__).name} == {}


def test_the_corpus_does_not_depend_on_where_or_how_python_was_started():
    """The quickstart's numbers differed between `python -m accelerate.commands.launch` and
    `accelerate launch` (sys.executable `.../python` or `.../python3`) and between machines: a
    signature default (`platform.architecture(executable=sys.executable)`) put the interpreter's
    path into the corpus."""
    from hf_outheads.training.corpora.stdlib import build_records

    texts = [row["text"] for rows in build_records("text").values() for row in rows]
    assert not [text for text in texts if sys.executable in text]
    assert any(text.startswith("platform.architecture(executable=sys.executable") for text in texts)



@pytest.mark.parametrize("backbone", ["preset", "pretrained"])
def test_a_train_run_looks_its_head_class_up_once(backbone, tmp_path, monkeypatch):
    """`hf-outheads train --head_type drill`, in process from its command line to its saved model
    and card: the head class is looked up in the registry once, when the options are parsed
    (`ModelOptions.head`); the config, the model, its tags and its card read it from there. The
    head is built once, the run's."""
    from accelerate.state import AcceleratorState, GradientState
    from transformers import GPT2LMHeadModel

    from head_cases import counted_lookups
    from hf_outheads.training import train

    heads, drill = [], HEAD_CLASSES["drill"]
    init = drill.__init__
    monkeypatch.setattr(drill, "__init__", lambda self, *args: (heads.append(self), init(self, *args))[1])
    lookups = counted_lookups(monkeypatch)
    if backbone == "preset":
        given = ["--model_preset", "gpt2-tiny", "--model_overrides", "{n_embd: 32, n_layer: 1, n_head: 2}",
                 "--tokenizer", "bpe", "--tokenizer_vocab_size", "300"]
    else:
        tokenizer = train_tokenizer(TEXTS, "bpe", 300)
        GPT2LMHeadModel(GPT2Config(n_embd=16, n_layer=1, n_head=2, vocab_size=len(tokenizer), n_positions=64)) \
            .save_pretrained(tmp_path / "plain")
        tokenizer.save_pretrained(tmp_path / "plain")
        given = ["--pretrained", str(tmp_path / "plain"), "--tokenizer", "auto"]
    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    train.main(given + ["--head_type", "drill", "--dataset_name", "stdlib_docstrings", "--dataset_config", "text",
                        "--max_train_samples", "40", "--max_eval_samples", "8", "--block_size", "32",
                        "--per_device_train_batch_size", "4", "--max_steps", "1", "--report_to", "none",
                        "--sample_max_new_tokens", "2", "--dataloader_num_workers", "0",
                        "--output_dir", str(tmp_path / "run")])
    assert (tmp_path / "run" / "README.md").is_file() and "drill" in (tmp_path / "run" / "config.json").read_text()
    assert lookups == ["drill"]
    assert len(heads) == 1  # the run's model's: the preflight checks the options from a config, building no head
