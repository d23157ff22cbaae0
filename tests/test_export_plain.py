"""`export_plain`: a model trained with a single-softmax head written as its backbone's own
transformers class. Each exported folder is loaded in a fresh Python that never imports
hf_outheads (`Auto*.from_pretrained`, no remote code): its logits are the wrapper's to 1e-5
and greedy and beam search generate the same tokens. One subprocess checks many folders."""

from __future__ import annotations

import dataclasses
import json
import re
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from hf_outheads import HEAD_CLASSES, OutHeadsConfig, OutHeadsForCausalLM, get_head_class
from hf_outheads.tools.export_plain import plain_export_capabilities
from head_cases import HEAD_CASES
from subprocess_runs import run
from tiny import ALL, SEQ2SEQ, VOCAB, model_class, perturb, tiny_config, tiny_model, tiny_original, word_tokenizer

EXACT_HEADS = {head: HEAD_CASES[head] for head, exact in plain_export_capabilities().items() if exact}


def with_output_bias(head: str, options: dict, bias: bool) -> dict:
    """`options` with `output_bias`: the head's own option, or its shared head's (`mtp`'s `head_options`)."""
    if "output_bias" in {f.name for f in dataclasses.fields(get_head_class(head).Options)}:
        return {**options, "output_bias": bias}
    return {**options, "head_options": {**options.get("head_options", {}), "output_bias": bias}}
BIASED = ("bart", "marian")  # families whose class adds a per-word bias (final_logits_bias)
GENERATE = dict(max_new_tokens=5, do_sample=False)

LOAD_AND_RUN = r"""
import sys, torch
from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM, AutoTokenizer
cases = torch.load(sys.argv[1])
results = {}
for name, case in cases.items():
    auto = AutoModelForSeq2SeqLM if case["seq2seq"] else AutoModelForCausalLM
    model = auto.from_pretrained(case["path"]).eval()
    with torch.no_grad():
        out = {"class": type(model).__name__, "logits": model(**case["inputs"]).logits}
        for beams in (1, 3):
            out[f"beams{beams}"] = model.generate(**case["prompt"], num_beams=beams, **case["generate"])
    if case.get("text"):
        out["tokens"] = AutoTokenizer.from_pretrained(case["path"])(case["text"])["input_ids"]
    results[name] = out
assert "hf_outheads" not in sys.modules, "the plain export must load without hf_outheads"
torch.save(results, sys.argv[2])
"""


def inputs_for(name: str, seed: int = 0) -> tuple[dict, dict]:
    """(forward inputs, generation prompt) for a tiny model of family `name`."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, VOCAB, (2, 7), generator=g)
    if name in SEQ2SEQ:
        return {"input_ids": ids, "decoder_input_ids": torch.randint(3, VOCAB, (2, 5), generator=g)}, {"input_ids": ids}
    return {"input_ids": ids}, {"input_ids": ids[:, :4], "attention_mask": torch.ones(2, 4, dtype=torch.long)}


@torch.no_grad()
def expected(model, family: str, path, text: str | None = None) -> dict:
    model.eval()
    forward, prompt = inputs_for(family)
    case = {"path": str(path), "seq2seq": family in SEQ2SEQ, "inputs": forward, "prompt": prompt, "generate": GENERATE,
            "text": text, "logits": model(**forward).logits}
    for beams in (1, 3):
        case[f"beams{beams}"] = model.generate(**prompt, num_beams=beams, **GENERATE)
    return case


def check_in_fresh_python(cases: dict, tmp_path) -> dict:
    """Load every exported folder in one subprocess without hf_outheads; compare with `cases`."""
    torch.save({name: {k: v for k, v in case.items() if k not in ("logits", "beams1", "beams3")}
                for name, case in cases.items()}, tmp_path / "cases.pt")
    done = run([sys.executable, "-c", LOAD_AND_RUN, str(tmp_path / "cases.pt"), str(tmp_path / "results.pt")],
               timeout=240)
    assert done.returncode == 0, done.stderr[-4000:]
    results = torch.load(tmp_path / "results.pt")
    for name, case in cases.items():
        got = results[name]
        torch.testing.assert_close(got["logits"], case["logits"], rtol=0, atol=1e-5, msg=lambda m: f"{name}: {m}")
        for beams in ("beams1", "beams3"):
            assert torch.equal(got[beams], case[beams]), (name, beams, got[beams], case[beams])
    return results


def export_case(model, family: str, tmp_path, name: str, **kwargs) -> dict:
    result = model.export_plain(tmp_path / name, **kwargs)
    assert result.exact and result.architecture == ALL[family][0].__name__, result
    return expected(model, family, tmp_path / name)


def test_every_affine_head_exports_exactly(tmp_path):
    """tied, linear, bilinear, drill, joint (identity activation) and mtp (sharing tied), perturbed, on every family:
    without an output bias where the class has none, with one (final_logits_bias) on BART/Marian.
    One subprocess loads all 36 folders (its start costs more than the models)."""
    cases, families = {}, {"t5-v1.1-joint": "t5"}
    for family in ALL:
        for head, options in EXACT_HEADS.items():
            model = perturb(tiny_model(family, head, with_output_bias(head, options, family in BIASED)))
            cases[f"{family}-{head}"] = export_case(model, family, tmp_path, f"{family}-{head}")
            families[f"{family}-{head}"] = family
    text = tiny_config("t5")  # T5 v1.1: no d_model**-0.5 output scaling (scale_decoder_outputs False)
    text.scale_decoder_outputs = False
    model = perturb(model_class("t5")(OutHeadsConfig(text_config=text, head_type="joint", head_options={
        "joint_dim": 16, "output_bias": False})).eval())
    assert model.config.hidden_scale == 1.0
    cases["t5-v1.1-joint"] = export_case(model, "t5", tmp_path, "t5-v1.1-joint")
    results = check_in_fresh_python(cases, tmp_path)
    untied = [name for name in cases if json.loads((tmp_path / name / "config.json").read_text())["tie_word_embeddings"]
              is False]
    assert not any(name.endswith("-tied") for name in untied)  # the output matrix is E: kept tied
    assert all(results[name]["class"] == ALL[families[name]][0].__name__ for name in cases)


def test_the_export_generates_with_a_model_set_to_draft(tmp_path):
    """`generation_config.use_mtp = True` (this package's drafting from the `mtp`
    head) was copied into the stock export, which has no predictors: its `generate` failed (`Could
    not find num_mtp_layers`). The export drops it and generates the drafting model's tokens."""
    model = tiny_model("gpt2", "mtp", {"num_future": 2, "head_options": {"output_bias": False}})
    model.generation_config.use_mtp = True
    prompt = inputs_for("gpt2")[1]["input_ids"][:1]
    want = model.generate(prompt, **GENERATE)
    assert model.head.draft_counts is not None  # the model drafted
    model.export_plain(tmp_path / "plain")
    assert "use_mtp" not in json.loads((tmp_path / "plain" / "generation_config.json").read_text())
    assert model.generation_config.use_mtp is True
    plain = AutoModelForCausalLM.from_pretrained(tmp_path / "plain").eval()
    assert torch.equal(plain.generate(prompt, **GENERATE), want)


def test_a_trained_drill_model_exports_exactly(tmp_path):
    """The tiny GPT-2 converted to drill (no output bias, dropout 0.1), trained a few steps on
    random tokens, exported while in training mode (the export is the eval-mode head), with its
    tokenizer; the model card names the head."""
    model = OutHeadsForCausalLM.from_backbone(tiny_original("gpt2"), "drill", {"output_bias": False, "dropout": 0.1})
    start = [p.detach().clone() for p in model.head.parameters()]
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model.train()
    g = torch.Generator().manual_seed(0)
    for _ in range(4):
        ids = torch.randint(3, VOCAB, (4, 12), generator=g)
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    assert all((p - s).abs().max() > 1e-3 for p, s in zip(model.head.parameters(), start))
    result = model.export_plain(tmp_path / "drill", tokenizer=word_tokenizer())
    assert model.training and result.exact and result.mean_kl is None
    case = expected(model, "gpt2", tmp_path / "drill", text="w5 w6 w7")
    results = check_in_fresh_python({"trained-drill": case}, tmp_path)
    assert results["trained-drill"]["tokens"] == [5, 6, 7]
    card = (tmp_path / "drill" / "README.md").read_text()
    assert "`drill` output head" in card and "arxiv:1905.05513" in card and "trust_remote_code" in card
    assert (tmp_path / "drill" / "generation_config.json").is_file()


def test_folding_keeps_the_context_map_and_its_offset():
    """`equivalent_lm_head` is the head's scores: joint's V and b_v, bilinear's W_l are folded in
    (without them the scores differ)."""
    h = torch.randn(5, 32, generator=torch.Generator().manual_seed(1))
    for head in ("joint", "bilinear"):  # joint_dim 32: the matrices of the dropped form still multiply
        model = perturb(tiny_model("bart", head))
        E = model.output_embedding_matrix()
        weight, bias = model.head.equivalent_lm_head(E)
        want = torch.nn.functional.linear(model.head.context(h), model.head.label_matrix(E), model.head.bias)
        torch.testing.assert_close(h @ weight.T + bias, want, rtol=1e-5, atol=1e-5)
        dropped = torch.nn.functional.linear(h, model.head.label_matrix(E), model.head.bias)
        assert (dropped - want).abs().max() > 1e-2


@pytest.mark.parametrize("family", ["gpt2", "llama", "qwen2", "mistral", "t5"])
def test_a_bias_the_class_cannot_hold_is_refused(family, tmp_path):
    model = perturb(tiny_model(family, "linear"))
    with pytest.raises(ValueError, match=r"adds a per-word output bias.*adds none.*'output_bias': False.*approximate=True"):
        model.export_plain(tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_zero_bias_exports_exactly_anywhere(tmp_path):
    """A head with a bias that is still zero (fresh) needs no place for it."""
    assert tiny_model("llama", "drill").export_plain(tmp_path / "out").exact


def test_a_joint_head_with_a_nonlinear_context_is_refused(tmp_path):
    model = tiny_model("gpt2", "joint", {"joint_dim": 16, "activation": "tanh", "output_bias": False})
    with pytest.raises(ValueError, match=r"tanh\(V h \+ b_v\) is not an affine map of h.*activation 'identity'"):
        model.export_plain(tmp_path / "out", approximate=True, input_ids=[[3, 4, 5]])
    # tanh on the label side only (form "output"): the context is h, so it exports exactly
    assert tiny_model("gpt2", "joint", {"activation": "tanh", "form": "output", "output_bias": False}).export_plain(
        tmp_path / "output-form").exact


@pytest.mark.parametrize("head", [head for head, exact in plain_export_capabilities().items() if not exact])
def test_heads_without_an_affine_form_are_refused(head, tmp_path):
    """The heads the capability table marks inexact (the mixtures, sigsoftmax) are refused, saying why."""
    reason = HEAD_CLASSES[head].plain_export_limit
    assert reason  # each says why itself (the serving table shows it)
    with pytest.raises(ValueError, match=rf"Head '{head}' has no plain equivalent: {re.escape(reason)}, so no stock"):
        tiny_model("bart", head, HEAD_CASES[head]).export_plain(tmp_path / "out", approximate=True, input_ids=[[3, 4]])


def test_approximate_drops_the_bias_and_measures_the_kl(tmp_path):
    model = perturb(tiny_model("llama", "drill"), scale=0.5)
    with pytest.raises(ValueError, match="approximate=True .* texts .* input_ids"):
        model.export_plain(tmp_path / "out", approximate=True)
    with pytest.raises(ValueError, match="texts need the tokenizer"):
        model.export_plain(tmp_path / "out", approximate=True, texts=["w3 w4"])
    ids = torch.randint(3, VOCAB, (3, 9), generator=torch.Generator().manual_seed(2))
    result = model.export_plain(tmp_path / "out", approximate=True, input_ids=ids)
    plain = AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    with torch.no_grad():
        want = model(input_ids=ids).logits
        got = plain(input_ids=ids).logits
    torch.testing.assert_close(got + model.head.bias.detach(), want, rtol=1e-5, atol=1e-5)  # the bias, dropped
    log_p, log_q = want.log_softmax(-1), got.log_softmax(-1)
    kl = (log_p.exp() * (log_p - log_q)).sum(-1).mean().item()
    assert not result.exact and result.mean_kl == pytest.approx(kl, rel=1e-4) and kl > 1e-3
    assert "approximation" in (tmp_path / "out" / "README.md").read_text()


def test_heads_without_an_output_bias(tmp_path):
    """output_bias=False: no parameter (joint: no b_v either); saved and loaded as such; the
    chunked and sampled losses run without it; resize and conversion handle it."""
    for head, options in EXACT_HEADS.items():
        if with_output_bias(head, {}, False) != {"output_bias": False}:
            continue  # a head sharing another (mtp): its shared head's case is this one
        model = tiny_model("gpt2", head, {**options, "output_bias": False})
        assert model.head.bias is None and not any(k.endswith("head.bias") for k in model.state_dict())
        if head == "joint":
            assert model.head.in_proj.bias is None
        ids = torch.randint(3, VOCAB, (2, 8), generator=torch.Generator().manual_seed(3))
        full = model(input_ids=ids, labels=ids).loss
        model.head.options.training_loss = "chunked"
        torch.testing.assert_close(model(input_ids=ids, labels=ids, return_logits=False).loss, full)
        model.head.options.training_loss = "sampled"
        model.train()
        model(input_ids=ids, labels=ids).loss.backward()
        model.eval()
        model.save_pretrained(tmp_path / head)
        loaded = model_class("gpt2").from_pretrained(tmp_path / head).eval()
        torch.testing.assert_close(loaded(input_ids=ids).logits, model(input_ids=ids).logits)
        model.resize_token_embeddings(VOCAB + 5)
        assert model(input_ids=ids).logits.shape[-1] == VOCAB + 5 and model.head.bias is None


def test_conversion_into_a_head_without_bias():
    """Exact from a bias-free original (GPT-2); from BART's non-zero final_logits_bias it cannot be."""
    gpt2 = tiny_original("gpt2")
    model = OutHeadsForCausalLM.from_backbone(gpt2, "tied", {"output_bias": False}).eval()
    ids = torch.randint(3, VOCAB, (2, 6), generator=torch.Generator().manual_seed(4))
    torch.testing.assert_close(model(input_ids=ids).logits, gpt2(input_ids=ids).logits)
    bart = model_class("bart").from_backbone(tiny_original("bart"), "tied")
    head = model_class("bart")(OutHeadsConfig(text_config=tiny_config("bart"), head_type="tied",
                                              head_options={"output_bias": False})).head
    weight, bias = bart.head.plain_lm_head(bart.output_embedding_matrix())
    assert not head.init_from_lm_head(weight, bias, weight)
    assert head.init_from_lm_head(weight, torch.zeros_like(bias), weight)


def test_command_line(tmp_path):
    """`python -m hf_outheads.tools.export <trained_dir> <out_dir>`: the saved model and its tokenizer."""
    from hf_outheads.tools.export import main

    model = perturb(tiny_model("llama", "drill"))
    model.save_pretrained(tmp_path / "trained")
    word_tokenizer().save_pretrained(tmp_path / "trained")
    with pytest.raises(SystemExit, match="output_bias.*--approximate --text-file"):
        main([str(tmp_path / "trained"), str(tmp_path / "out")])
    (tmp_path / "sample.txt").write_text("w5 w6 w7 w8\n\nw9 w10\n")
    report = main([str(tmp_path / "trained"), str(tmp_path / "out"), "--approximate", "--text-file",
                   str(tmp_path / "sample.txt")])
    assert report["architecture"] == "LlamaForCausalLM" and not report["exact"] and report["mean_kl"] > 0
    assert (tmp_path / "out" / "tokenizer.json").is_file()


def suggested_flags(message: str, given=()) -> list[str]:
    """The command-line options a refusal names (`--text-file FILE` with its argument) besides those `given`."""
    return [flag for flag in re.findall(r"--[a-z][\w-]*(?: FILE)?", message.split(" (`")[0])
            if flag.split()[0] not in given]


def test_every_fix_an_export_refusal_names_works(tmp_path):
    """Each refusal of `hf-outheads export` that names a fix (an option to add, a training option, a
    file to give) is followed as written, and the export then succeeds. A Llama model
    trained with `logit_softcap` was told `--approximate --text-file FILE`, which refused the same way."""
    from transformers import Gemma2Config

    from hf_outheads.tools.export import main

    sample = tmp_path / "sample.txt"
    sample.write_text("w5 w6 w7 w8\n\nw9 w10 w11\n")
    saved = iter(range(100))

    def trained(model, tokenizer: bool = True):
        folder = tmp_path / f"trained{next(saved)}"
        model.save_pretrained(folder)
        if tokenizer:
            word_tokenizer().save_pretrained(folder)
        return folder

    def refused(*argv) -> str:
        with pytest.raises(SystemExit) as error:
            main([str(a) for a in argv])
        assert error.value.code == 2
        return str(error.value)

    def export(*argv) -> dict:
        out = tmp_path / f"out{next(saved)}"
        return main([str(a) for a in (argv[0], out, *argv[1:])])

    def follow(message: str, folder, *argv) -> dict:
        """The export again with the options the refusal names added (FILE: the sample text)."""
        flags = [part for flag in suggested_flags(message, argv) for part in flag.replace(" FILE", f" {sample}").split()]
        return export(folder, *argv, *flags)

    approximate = ["--approximate", "--text-file FILE"]
    # an output bias Llama cannot hold: train without it, or --approximate --text-file FILE
    biased = trained(perturb(tiny_model("llama", "drill")))
    said = refused(biased, tmp_path / "x")
    assert "Train with head_options={'output_bias': False}" in said and suggested_flags(said) == approximate
    report = follow(said, biased)
    assert not report["exact"] and report["dropped"] == ["the head's per-word output bias"] and report["mean_kl"] > 0
    assert export(trained(perturb(tiny_model("llama", "drill", {"output_bias": False}))))["exact"]
    # a soft cap Llama has no field for: train without it or on Gemma 2/3, or --approximate --text-file FILE
    capped_model = perturb(tiny_model("llama", "linear", {"logit_softcap": 30.0, "output_bias": False}), scale=1.0)
    capped = trained(capped_model)
    said = refused(capped, tmp_path / "x")
    assert said.startswith("Not exported: The 'llama' family's LM head applies no soft cap") and \
        "Train without logit_softcap (or on a family that holds a cap: Gemma 2/3)" in said
    assert suggested_flags(said) == approximate
    report = follow(said, capped)
    assert not report["exact"] and report["dropped"] == ["the head's soft cap of its scores at 30"]
    assert report["mean_kl"] > 1e-3
    plain = AutoModelForCausalLM.from_pretrained(report["path"]).eval()
    ids = inputs_for("llama")[0]["input_ids"]
    with torch.no_grad():
        want, got = capped_model(input_ids=ids).logits, plain(input_ids=ids).logits
    torch.testing.assert_close(30.0 * torch.tanh(got / 30.0), want, rtol=1e-5, atol=1e-5)  # the cap, dropped
    assert torch.equal(got.argmax(-1), want.argmax(-1))  # the cap keeps the scores' order
    card = (Path(report["path"]) / "README.md").read_text()
    assert "has no place for the head's soft cap of its scores at 30, so the export leaves it out" in card
    assert export(trained(perturb(tiny_model("llama", "linear", {"output_bias": False}))))["exact"]
    gemma = Gemma2Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=64)
    torch.manual_seed(0)
    report = export(trained(OutHeadsForCausalLM(OutHeadsConfig(text_config=gemma, head_type="linear", head_options={
        "logit_softcap": 15.0, "output_bias": False}))))
    assert report["exact"] and report["architecture"] == "Gemma2ForCausalLM"
    # both: --approximate drops both
    both = trained(perturb(tiny_model("llama", "drill", {"logit_softcap": 30.0})))
    report = follow(refused(both, tmp_path / "x"), both)
    assert report["dropped"] == ["the head's soft cap of its scores at 30", "the head's per-word output bias"]
    assert "has no place for the head's soft cap of its scores at 30 nor for the head's per-word output bias, so the " \
           "export leaves them out" in (Path(report["path"]) / "README.md").read_text()
    # a joint head with a tanh context: activation 'identity', or form 'output' or 'bilinear'; no --approximate
    joint = trained(tiny_model("gpt2", "joint", {"joint_dim": 16, "activation": "tanh", "output_bias": False}))
    said = refused(joint, tmp_path / "x", "--approximate", "--text-file", sample)
    assert "Train with activation 'identity' (the default), or form 'output' or 'bilinear'" in said
    assert suggested_flags(said) == []
    for options in ({"joint_dim": 16, "activation": "identity"}, {"activation": "tanh", "form": "output"},
                    {"activation": "tanh", "form": "bilinear"}):
        assert export(trained(perturb(tiny_model("gpt2", "joint", {"output_bias": False, **options}))))["exact"], options
    # a mixture: served with hf_outheads; no option of the export's
    mixture = trained(tiny_model("gpt2", "mos", HEAD_CASES["mos"]))
    said = refused(mixture, tmp_path / "x", "--approximate", "--text-file", sample)
    assert "Serve the model with hf_outheads" in said and suggested_flags(said) == []
    assert AutoModelForCausalLM.from_pretrained(mixture).config.head_type == "mos"
    # a folder that is not empty: --overwrite
    full = tmp_path / "full"
    full.mkdir()
    (full / "old.txt").write_text("old")
    plain = trained(tiny_model("gpt2", "tied", {"output_bias": False}))
    said = refused(plain, full)
    assert suggested_flags(said) == ["--overwrite"]
    assert main([str(plain), str(full), *suggested_flags(said)])["exact"] and not (full / "old.txt").exists()
    # --approximate without its text: --text-file FILE
    said = refused(plain, tmp_path / "x", "--approximate")
    assert suggested_flags(said, ["--approximate"]) == ["--text-file FILE"]
    assert follow(said, plain, "--approximate")["mean_kl"] < 1e-6
    # a text file without text: a file of lines of text
    (tmp_path / "blank.txt").write_text("\n  \n")
    said = refused(plain, tmp_path / "x", "--approximate", "--text-file", tmp_path / "blank.txt")
    assert "holds no text: give a few lines of the text the model will serve" in said
    assert export(plain, "--approximate", "--text-file", sample)["mean_kl"] < 1e-6
    # a text file and no tokenizer to read it with: save the tokenizer there
    bare = trained(perturb(tiny_model("llama", "drill")), tokenizer=False)
    said = refused(bare, tmp_path / "x", "--approximate", "--text-file", sample)
    assert "holds none: save the tokenizer the model was trained with there (tokenizer.save_pretrained)" in said
    word_tokenizer().save_pretrained(bare)
    assert export(bare, "--approximate", "--text-file", sample)["mean_kl"] > 0
