"""The `mtp` head: future-token losses (shifts, causality, weights), drafting that reproduces the
predictors' own teacher-forced predictions, greedy self-speculative decoding token-identical to
plain greedy on every causal family, sampling, export without the predictors, options."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from hf_outheads import HeadInputs, OutHeadsConfig
from hf_outheads.mtp_drafting import FutureDrafts
from tiny import CAUSAL, VOCAB, batch, tiny_config, tiny_model

FORMS = ("sequential", "independent")


def mtp_model(family="llama", form="sequential", num_future=3, seed=0, **options):
    """A tiny model whose predictors are noisy enough that drafts are both accepted and rejected."""
    model = tiny_model(family, "mtp", {"num_future": num_future, "form": form, "num_attention_heads": 2, **options},
                       seed=seed)
    with torch.no_grad():
        for name, param in model.head.predictors.named_parameters():
            if "norm" not in name:
                param.add_(torch.randn_like(param) * 0.1)
    return model


def prompts(count=4, length=5):
    g = torch.Generator().manual_seed(7)
    return [torch.randint(3, VOCAB, (1, length), generator=g) for _ in range(count)]


def reference_future_nll(model, data, k):
    """Depth k's mean NLL computed position by position from the formulas, not the head's loop:
    depth j reads (sequential) the previous depth's state and token t + j, predicts token t + j + 1."""
    head, ids = model.head, data["input_ids"]
    hidden = model.backbone(input_ids=ids).last_hidden_state * model.config.hidden_scale
    E = model.output_embedding_matrix()
    state = hidden
    for j in range(1, k + 1):
        predictor = head.predictors[j - 1]
        if predictor.merge is None:
            state = predictor(hidden)
        else:
            ahead = torch.cat([ids[:, j:], ids.new_zeros(ids.shape[0], j)], dim=1)  # token t + j
            state = predictor(state, E[ahead])
    logits = head.shared(HeadInputs(head.predictors[k - 1].norm(state), E)).logits
    T = ids.shape[1]
    return F.cross_entropy(logits[:, : T - k - 1].reshape(-1, VOCAB), ids[:, k + 1 :].reshape(-1))


@pytest.mark.parametrize("form", FORMS)
def test_future_losses_are_the_shifted_cross_entropies_weighted(form):
    model = mtp_model(form=form, loss_weight=0.5).train()
    data = batch("llama", length=9)
    out = model(**data)
    terms = [reference_future_nll(model, data, k) for k in (1, 2, 3)]
    for k, want in enumerate(terms, start=1):
        torch.testing.assert_close(out.aux_terms[f"mtp_nll_{k}"], want.detach(), rtol=1e-5, atol=1e-5)
    # each depth's NLL sum over the next-token loss's count (T - 1 per sequence; depth k has T - 1 - k)
    T = data["input_ids"].shape[1]
    future = sum(term * (T - 1 - k) / (T - 1) for k, term in enumerate(terms, start=1))
    torch.testing.assert_close(out.loss, out.nll_loss + 0.5 / 3 * future, rtol=1e-5, atol=1e-5)
    assert out.aux_loss is None and out.nll_loss < out.loss
    assert model(input_ids=data["input_ids"]).loss is None  # no labels, no future terms


@pytest.mark.parametrize("form", FORMS)
def test_a_prediction_never_sees_its_target(form):
    """Depth k's prediction at position t (token t + k + 1) is unchanged when every token after t + k changes."""
    model = mtp_model(form=form)
    ids = batch("llama", length=10)["input_ids"]
    t = 3
    for k in (1, 2, 3):
        changed = ids.clone()
        changed[:, t + k + 1 :] = (ids[:, t + k + 1 :] + 5) % VOCAB
        states = []
        for probe in (ids, changed):
            hidden = model.backbone(input_ids=probe).last_hidden_state
            tokens = torch.cat([probe[:, 1:], probe.new_full((probe.shape[0], 1), -100)], dim=1)
            states.append(dict(model.head.future_states(hidden, model.output_embedding_matrix(), tokens))[k][:, t])
        torch.testing.assert_close(*states, msg=f"depth {k}")
        if k == 1:  # and the changed tokens do reach the later positions (the check is not vacuous)
            later = [dict(model.head.future_states(model.backbone(input_ids=p).last_hidden_state,
                                                   model.output_embedding_matrix(),
                                                   torch.cat([p[:, 1:], p[:, :1]], dim=1)))[1][:, -1] for p in (ids, changed)]
            assert not torch.allclose(*later)


def test_chunked_and_bf16_future_losses_match_the_full_ones():
    """The future terms run through the shared head's memory-lean loss; with `training_loss: chunked`
    the whole loss equals the full-logits one, and under bf16 autocast stays close."""
    data = batch("llama", length=9)
    full = mtp_model(head="linear").train()
    chunked = mtp_model(head="linear", head_options={"training_loss": "chunked"}).train()
    chunked.load_state_dict(full.state_dict())
    a, b = full(**data), chunked(**data)
    torch.testing.assert_close(b.loss, a.loss, rtol=1e-5, atol=1e-5)
    assert b.logits is None  # the chunked loss holds no logits
    a.loss.backward(), b.loss.backward()
    for (name, p), q in zip(full.named_parameters(), chunked.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-6, msg=name)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        low = chunked(**data)
    for name, value in a.aux_terms.items():
        torch.testing.assert_close(low.aux_terms[name].float(), value, rtol=0.03, atol=0.03)


def recorded_drafts(monkeypatch):
    calls = []
    original = FutureDrafts.draft

    def draft(self, input_ids, states):
        tokens, scores = original(self, input_ids, states)
        calls.append((input_ids.clone(), torch.cat(tokens, dim=1)))
        return tokens, scores

    monkeypatch.setattr(FutureDrafts, "draft", draft)
    return calls


@pytest.mark.parametrize("form", FORMS)
def test_drafts_are_the_teacher_forced_predictions(form, monkeypatch):
    """Every round's drafts equal what the predictors predict at the last verified position over
    the whole sequence (the training path), the lower depths' drafts as the tokens ahead: the
    caches, their crops and the kept states reproduce the full computation."""
    model = mtp_model(form=form)
    calls = recorded_drafts(monkeypatch)
    for prompt in prompts(3):
        model.generate(prompt, max_new_tokens=24, do_sample=False, use_mtp=True)
    assert len(calls) > 10
    E = model.output_embedding_matrix()
    for ids, drafts in calls:
        L = ids.shape[1] - 1
        hidden = model.backbone(input_ids=ids[:, :L]).last_hidden_state
        extended = torch.cat([ids, drafts], dim=1)
        tokens = extended[:, 1 : L + 1 + drafts.shape[1]]  # token t + 1 at position t, over the drafts too
        hidden = torch.cat([hidden, hidden.new_zeros(1, tokens.shape[1] - L, hidden.shape[-1])], dim=1)
        for k, state in model.head.future_states(hidden, E, tokens):
            logits = model.head.shared(HeadInputs(model.head.predictors[k - 1].norm(state[:, L - 1]), E)).logits
            assert logits.argmax(-1).item() == drafts[0, k - 1].item(), (form, L, k)


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("family", sorted(CAUSAL))
def test_greedy_drafting_is_token_identical_to_greedy(family, form):
    """Plain greedy, and greedy with a repetition penalty (a logits processor, which also keeps these
    random models from repeating one token, so that drafts are refused as well as kept)."""
    model = mtp_model(family, form, seed=1)
    accepted = proposed = 0
    for prompt in prompts():
        for processors in ({}, {"repetition_penalty": 1.5}):
            options = dict(max_new_tokens=20, min_new_tokens=20, do_sample=False, **processors)
            plain = model.generate(prompt, **options)
            drafted = model.generate(prompt, use_mtp=True, **options)
            assert torch.equal(drafted, plain), (family, form, processors)
            counts = model.head.draft_counts
            accepted, proposed = accepted + sum(counts.accepted), proposed + sum(counts.proposed)
            assert counts.tokens == 20 and counts.rounds <= 20  # every round verifies; some add several tokens
    assert 0 < accepted < proposed, (accepted, proposed)  # drafts were both kept and refused


def test_drafting_returns_every_layers_states_when_asked():
    """`output_hidden_states=True` with `return_dict_in_generate=True`: the states of every layer, per new token, as
    greedy without drafting returns them (the verification forwards capture every layer, the drafts read the last);
    a partial capture, which transformers' assisted decoding cannot split per token, is refused in one line."""
    model = mtp_model(seed=1).eval()
    options = dict(max_new_tokens=12, min_new_tokens=12, do_sample=False, repetition_penalty=1.5,
                   return_dict_in_generate=True, output_hidden_states=True)
    for prompt in prompts(2):
        plain = model.generate(prompt, **options)
        drafted = model.generate(prompt, use_mtp=True, **options)
        assert torch.equal(drafted.sequences, plain.sequences)
        assert sum(model.head.draft_counts.accepted) > 0  # some verification forwards scored several tokens
        assert len(drafted.hidden_states) == len(plain.hidden_states) == 12
        for got, want in zip(drafted.hidden_states, plain.hidden_states):
            assert len(got) == len(want) == model.head.dims.num_layers + 1
            for a, b in zip(got, want):
                torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match=r"Head 'mtp': use_mtp=True returns the hidden states of every layer or of "
                                         r"none, not output_hidden_states=\[-1\]"):
        model.generate(prompts(1)[0], max_new_tokens=3, use_mtp=True, output_hidden_states=[-1])


@pytest.mark.parametrize("form", FORMS)
def test_a_prompt_given_as_embeddings_drafts_as_its_ids(form, monkeypatch):
    """`generate(inputs_embeds=..., use_mtp=True)` took the prompt's length from
    `input_ids`, which then hold the generated tokens alone, and failed; plain greedy worked. With
    `inputs_embeds = E[ids]` every round drafts what the ids prompt drafts, and the output is plain
    greedy's (the drafts both kept and refused)."""
    model = mtp_model(form=form, seed=2)
    calls = recorded_drafts(monkeypatch)
    options = dict(max_new_tokens=20, min_new_tokens=20, do_sample=False)
    accepted = proposed = 0
    for prompt in prompts(3):
        embeds = model.get_input_embeddings()(prompt).detach()
        drafted = model.generate(inputs_embeds=embeds, use_mtp=True, **options)
        assert torch.equal(drafted, model.generate(inputs_embeds=embeds, **options))
        counts, from_embeds = model.head.draft_counts, [drafts for _, drafts in calls]
        accepted, proposed = accepted + sum(counts.accepted), proposed + sum(counts.proposed)
        calls.clear()
        assert torch.equal(model.generate(prompt, use_mtp=True, **options)[:, prompt.shape[1]:], drafted)
        assert len(calls) == len(from_embeds) and all(map(torch.equal, from_embeds, [d for _, d in calls]))
        calls.clear()
    assert 0 < accepted < proposed, (accepted, proposed)


def test_greedy_drafting_stops_at_eos_and_max_length():
    model = mtp_model(seed=1)
    for prompt in prompts():
        plain = model.generate(prompt, max_new_tokens=9, do_sample=False)
        eos = int(plain[0, prompt.shape[1] + 4])
        want = model.generate(prompt, max_new_tokens=9, do_sample=False, eos_token_id=eos, pad_token_id=0)
        got = model.generate(prompt, max_new_tokens=9, do_sample=False, eos_token_id=eos, pad_token_id=0, use_mtp=True)
        assert torch.equal(got, want) and got.shape[1] <= prompt.shape[1] + 9


def test_sampling_with_drafts_is_seeded_and_speculative():
    """Sampling drafts candidates with their scores (speculative sampling verifies them): the same seed
    gives the same tokens, drafts are counted, and every round adds at least one token."""
    model = mtp_model(seed=1)
    prompt = prompts(1)[0]
    runs = []
    for _ in range(2):
        torch.manual_seed(3)
        runs.append(model.generate(prompt, max_new_tokens=16, min_new_tokens=16, do_sample=True, top_k=20,
                                   use_mtp=True))
    assert torch.equal(*runs) and runs[0].shape[1] == prompt.shape[1] + 16
    counts = model.head.draft_counts
    assert sum(counts.proposed) > 0 and counts.tokens == 16


def ranked_model(seed=1, size=40, **options):
    """A drafting model whose draft vocabulary is ranked from counts that put every id in
    [30, 30 + size) first: the shortlist is then exactly those ids."""
    model = mtp_model(seed=seed, draft_vocab_size=size, **options)
    counts = torch.zeros(VOCAB)
    counts[30 : 30 + size] = torch.arange(size, 0, -1).float() + 5
    model.head.set_word_counts(counts)
    return model


@pytest.mark.parametrize("head", ["tied", "linear", "bilinear", "joint", "drill", "sigsoftmax"])
def test_a_shared_heads_word_scorer_is_its_logits_at_those_words(head):
    """`word_scorer(E, rows)(h)` is `forward`'s logits at the columns `rows` (and at all of them
    without rows), for every head the predictors can share."""
    model = tiny_model("gpt2", "mtp", {"head": head, "num_attention_heads": 2})
    shared, E = model.head.shared, model.output_embedding_matrix()
    with torch.no_grad():
        for parameter in shared.parameters():  # biases and encoders off their initial zeros and identities
            parameter.add_(torch.randn_like(parameter) * 0.05)
        hidden = torch.randn(2, 5, E.shape[1])
        logits = shared(HeadInputs(hidden, E)).logits.float()
        rows = torch.tensor([3, 17, 42, 98])
        torch.testing.assert_close(shared.word_scorer(E, rows)(hidden).float(), logits[..., rows], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(shared.word_scorer(E)(hidden).float(), logits, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="Head 'mos'"):
        tiny_model("gpt2", "mos").head.word_scorer(E)


def test_the_draft_vocabulary_is_the_most_frequent_words_and_is_saved(tmp_path):
    from hf_outheads import OutHeadsForCausalLM

    model = ranked_model(size=4)
    counts = torch.zeros(VOCAB)
    counts[[50, 7, 81, 12, 64]] = torch.tensor([9.0, 9.0, 3.0, 8.0, 1.0])  # a tie at 9: both kept
    model.head.set_word_counts(counts)
    assert model.head.draft_tokens.tolist() == [7, 12, 50, 81]
    model.save_pretrained(tmp_path)
    loaded = OutHeadsForCausalLM.from_pretrained(tmp_path)
    assert loaded.head.draft_tokens.tolist() == [7, 12, 50, 81]
    model.head.draft_tokens[1] = 7  # a checkpoint whose draft vocabulary repeats a word
    model.save_pretrained(tmp_path / "bad")
    with pytest.raises(ValueError, match="Head 'mtp'.*'draft_tokens'"):
        OutHeadsForCausalLM.from_pretrained(tmp_path / "bad")


def test_resizing_keeps_the_draft_vocabulary_below_the_new_size():
    model = ranked_model(size=40)  # ids 30..69
    model.resize_token_embeddings(120)
    assert model.head.draft_tokens.tolist() == list(range(30, 70))
    model.resize_token_embeddings(60)
    assert model.head.draft_tokens.tolist() == list(range(40))
    with pytest.raises(ValueError, match="'draft_vocab_size'=40"):
        model.resize_token_embeddings(40)


@pytest.mark.parametrize("form", FORMS)
def test_drafts_from_the_draft_vocabulary_keep_greedy_output(form, monkeypatch):
    """With a shortlist, every draft is the teacher-forced argmax over the shortlist's words only,
    and greedy output (with and without a logits processor) is plain greedy's."""
    model = ranked_model(form=form)
    rows = model.head.draft_tokens
    calls = recorded_drafts(monkeypatch)
    for prompt in prompts(3):
        for processors in ({}, {"repetition_penalty": 1.5, "min_new_tokens": 16}):  # none, then two
            options = dict(max_new_tokens=16, do_sample=False, **processors)
            assert torch.equal(model.generate(prompt, use_mtp=True, **options), model.generate(prompt, **options))
    drafted = torch.cat([drafts for _, drafts in calls], dim=1)
    assert torch.isin(drafted, rows).all()
    E = model.output_embedding_matrix()
    ids, drafts = calls[0]
    L = ids.shape[1] - 1
    hidden = model.backbone(input_ids=ids[:, :L]).last_hidden_state
    state = next(model.head.future_states(hidden, E, ids[:, 1 : L + 1]))[1]
    logits = model.head.shared(HeadInputs(model.head.predictors[0].norm(state[:, L - 1]), E)).logits
    assert rows[logits[..., rows].argmax(-1)].item() == drafts[0, 0].item()


def test_sampled_drafts_score_only_the_draft_vocabulary():
    """Sampling hands the verification every word's draft scores: -inf outside the shortlist (a
    draft's probability there is 0, which speculative sampling's acceptance and residual take as
    such), the shared head's scores inside; every sampled draft is a shortlist word."""
    from hf_outheads.mtp_drafting import FutureDrafts

    model = ranked_model()
    rows = model.head.draft_tokens
    seen = []
    original = FutureDrafts.get_candidates

    def get_candidates(self, *args, **kwargs):
        ids, scores = original(self, *args, **kwargs)
        if scores is not None:
            seen.append((ids[0, -scores.shape[1]:], scores))
        return ids, scores

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(FutureDrafts, "get_candidates", get_candidates)
        torch.manual_seed(3)
        out = model.generate(prompts(1)[0], max_new_tokens=16, min_new_tokens=16, do_sample=True, use_mtp=True)
    assert out.shape[1] == prompts(1)[0].shape[1] + 16 and seen
    outside = torch.ones(VOCAB, dtype=torch.bool)
    outside[rows] = False
    for drafted, scores in seen:
        assert torch.isin(drafted, rows).all()
        assert torch.isneginf(scores[..., outside]).all() and torch.isfinite(scores[..., rows]).all()


def test_draft_counts_and_a_head_without_predictors():
    model = tiny_model("llama", "tied")
    with pytest.raises(ValueError, match=r"Head 'tied'.*use_mtp=True needs .*head_type='mtp'"):
        model.generate(prompts(1)[0], max_new_tokens=3, use_mtp=True)


def test_export_plain_drops_the_predictors(tmp_path):
    from transformers import AutoModelForCausalLM

    model = mtp_model("gpt2", head_options={"output_bias": False})
    result = model.export_plain(tmp_path / "plain")
    assert result.exact and result.architecture == "GPT2LMHeadModel"
    plain = AutoModelForCausalLM.from_pretrained(tmp_path / "plain").eval()
    assert not any("predictors" in key for key in plain.state_dict())
    ids = batch("gpt2")["input_ids"]
    with torch.no_grad():
        torch.testing.assert_close(plain(ids).logits, model(ids).logits, rtol=1e-5, atol=1e-5)
    prompt = prompts(1)[0]
    assert torch.equal(plain.generate(prompt, max_new_tokens=12, do_sample=False),
                       model.generate(prompt, max_new_tokens=12, do_sample=False, use_mtp=True))


@pytest.mark.parametrize("options,option", [
    ({"head": "mos"}, "'head'"),
    ({"head": "doc"}, "'head'"),
    ({"head": "mtp"}, "'head'"),
    ({"head": "nope"}, "'head'"),
    ({"head_options": {"depth": 2}}, "'head_options'"),
    ({"head": "drill", "head_options": {"depth": "2"}}, "'depth'"),
    ({"num_future": 0}, "'num_future'"),
    ({"form": "parallel"}, "'form'"),
    ({"loss_weight": -1}, "'loss_weight'"),
    ({"num_attention_heads": 3}, "'num_attention_heads'"),
    ({"head_options": [1]}, "'head_options'"),
    ({"draft_vocab_size": 0}, "'draft_vocab_size'"),
    ({"draft_vocab_size": VOCAB}, "'draft_vocab_size'"),
])
def test_bad_options_name_the_head_and_the_option(options, option):
    with pytest.raises(ValueError) as error:
        OutHeadsConfig(text_config=tiny_config("gpt2"), head_type="mtp", head_options=options)
    assert "Head 'mtp'" in str(error.value) and option in str(error.value), str(error.value)


def test_conversion_keeps_the_next_token_model_and_shares_the_converted_head():
    from hf_outheads import OutHeadsForCausalLM
    from tiny import tiny_original

    original = tiny_original("gpt2")
    model = OutHeadsForCausalLM.from_backbone(original, "mtp", {"head": "drill", "num_future": 2}).eval()
    assert model.config.head_options["head_options"]["dropout"] == 0.0  # drill's conversion default
    converted_tied = OutHeadsForCausalLM.from_backbone(original, "mtp").eval()
    ids = batch("gpt2")["input_ids"]
    with torch.no_grad():
        torch.testing.assert_close(converted_tied(ids).logits, original(ids).logits, rtol=1e-5, atol=1e-5)
    assert converted_tied.get_output_embeddings().weight is converted_tied.get_input_embeddings().weight


def test_training_loop_logs_the_future_losses_apart():
    """`hf_outheads.training.loop`'s running record carries each depth's loss (`train_mtp_nll_k`) beside the
    next-token loss (`train_loss`)."""
    from hf_outheads.training.loop import RunningLoss

    running = RunningLoss()
    running.add(3.0, None, {"mtp_nll_1": 4.0, "mtp_nll_2": 5.0})
    running.add(1.0, None, {"mtp_nll_1": 2.0, "mtp_nll_2": 3.0})
    record = running.record(1e-3)
    assert record == {"train_loss": 2.0, "learning_rate": 1e-3, "train_mtp_nll_1": 3.0, "train_mtp_nll_2": 4.0}
    assert "train_mtp_nll_1" not in (running.add(1.0, None), running.record(1e-3))[1]


def test_trainer_trains_the_predictors(tmp_path, caplog):
    from datasets import Dataset
    from transformers import Trainer, TrainingArguments
    from transformers.utils import logging as hf_logging

    model = mtp_model().train()
    ids = torch.randint(3, VOCAB, (8, 12), generator=torch.Generator().manual_seed(0))
    data = Dataset.from_dict({"input_ids": ids.tolist(), "labels": ids.tolist()})
    before = {k: v.clone() for k, v in model.head.predictors.state_dict().items()}
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=3, per_device_train_batch_size=4, learning_rate=1e-2,
                             report_to=[], save_strategy="no", logging_steps=1, use_cpu=True)
    hf_logging.warning_once.cache_clear()
    with caplog.at_level("WARNING", logger="hf_outheads"):
        Trainer(model=model, args=args, train_dataset=data).train()
    moved = [k for k, v in model.head.predictors.state_dict().items() if not torch.equal(v, before[k])]
    assert len(moved) == len(before)
    assert "without labels" not in caplog.text  # the labels reached the model


def test_trainer_evaluate_reports_the_next_token_loss_whose_exp_is_the_perplexity(tmp_path):
    """`Trainer.evaluate()`'s `eval_loss` is the next-token NLL, what `hf_outheads/training/evaluation.py` reports (so
    `exp(eval_loss)` is the perplexity), not the training objective with the future tokens' terms; a training
    forward still adds them, and an evaluation forward still names each depth's loss (`mtp_nll_k`)."""
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState
    from datasets import Dataset
    from transformers import Trainer, TrainingArguments

    from hf_outheads.training.evaluation import evaluate_perplexity

    model = mtp_model(loss_weight=1.0)
    ids = torch.randint(3, VOCAB, (8, 12), generator=torch.Generator().manual_seed(0))
    data = Dataset.from_dict({"input_ids": ids.tolist(), "labels": ids.tolist()})
    args = TrainingArguments(output_dir=str(tmp_path), per_device_eval_batch_size=4, report_to=[], use_cpu=True)
    got = Trainer(model=model, args=args, eval_dataset=data).evaluate()["eval_loss"]
    AcceleratorState._reset_state(True)
    batches = [{"input_ids": part, "labels": part} for part in ids.split(4)]
    want = evaluate_perplexity(Accelerator(cpu=True), model, batches, "causal_lm")["eval_loss"]
    assert got == pytest.approx(want, rel=1e-5)
    model.eval()
    with torch.no_grad():
        evaluated, trained = model(input_ids=ids, labels=ids), model.train()(input_ids=ids, labels=ids)
    assert evaluated.loss == evaluated.nll_loss and set(evaluated.aux_terms) == {"mtp_nll_1", "mtp_nll_2", "mtp_nll_3"}
    assert trained.loss > trained.nll_loss + 1.0  # the future terms (weight 1: their mean NLL) in training alone


def test_trainer_with_label_smoothing_warns_once_that_the_predictors_do_not_train(tmp_path, caplog):
    """With `label_smoothing_factor` Trainer takes the labels out of the batch and
    smooths the next-token loss from the logits, so the predictors, whose losses need the labels,
    silently did not train. The model now says so, once, naming the option."""
    from datasets import Dataset
    from transformers import Trainer, TrainingArguments
    from transformers.utils import logging as hf_logging

    model = mtp_model().train()
    ids = torch.randint(3, VOCAB, (8, 12), generator=torch.Generator().manual_seed(0))
    data = Dataset.from_dict({"input_ids": ids.tolist(), "labels": ids.tolist()})
    before = {k: v.clone() for k, v in model.head.predictors.state_dict().items()}
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=2, per_device_train_batch_size=4, learning_rate=1e-2,
                             report_to=[], save_strategy="no", use_cpu=True, label_smoothing_factor=0.1)
    hf_logging.warning_once.cache_clear()
    with caplog.at_level("WARNING", logger="hf_outheads"):
        Trainer(model=model, args=args, train_dataset=data).train()
    warnings = [r.getMessage() for r in caplog.records if "without labels" in r.getMessage()]
    assert len(warnings) == 1 and "label_smoothing_factor" in warnings[0] and "predictors" in warnings[0], warnings
    assert all(torch.equal(v, before[k]) for k, v in model.head.predictors.state_dict().items())


@pytest.mark.parametrize("family", sorted(CAUSAL))
def test_the_last_hidden_state_alone_is_the_captured_one(family):
    """`output_hidden_states=-1` (what drafting asks for every step) returns the last entry of the full
    capture, without capturing every layer."""
    model = tiny_model(family, "tied")
    ids = batch(family)["input_ids"]
    with torch.no_grad():
        full = model(ids, output_hidden_states=True).hidden_states
        last = model(ids, output_hidden_states=-1).hidden_states
    assert len(last) == len(full) and all(state is None for state in last[:-1])
    assert torch.equal(last[-1], full[-1])


def test_window_step_averages_the_named_terms_over_the_window():
    """`hf_outheads.training.loop.window_step` hands back each depth's loss, the mean over the window's micro-batches,
    and its accumulated gradient is the whole batch's: the future terms sum over micro-batches as the
    next-token loss does."""
    from hf_outheads.training.options import RunOptions

    from test_training_checkpoints_and_launches import frozen_window_parts

    from hf_outheads.training.loop import NonFiniteWatch, window_step

    model = mtp_model(num_future=2).train()
    ids = torch.randint(3, VOCAB, (4, 9), generator=torch.Generator().manual_seed(0))
    window = [{"input_ids": ids[:2], "labels": ids[:2]}, {"input_ids": ids[2:], "labels": ids[2:]}]
    with torch.no_grad():
        want = [model(**batch).aux_terms for batch in window]
    model(input_ids=ids, labels=ids).loss.backward()
    expected = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    accelerator, optimizer, scheduler = frozen_window_parts(model)
    terms = {}
    window_step(accelerator, model, optimizer, scheduler, window, RunOptions.from_flat({"max_grad_norm": None}),
                NonFiniteWatch(accelerator.device), terms)
    assert sorted(terms) == ["mtp_nll_1", "mtp_nll_2"]
    for name, value in terms.items():
        assert float(value) == pytest.approx((want[0][name] + want[1][name]).item() / 2, rel=1e-5)
    for name, param in model.named_parameters():
        torch.testing.assert_close(param.grad, expected[name], rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.parametrize("form", FORMS)
def test_forward_flops_match_torch_counter_with_labels(form):
    """`forward_flops` counts the training forward: the shared head once per depth (the future depths'
    chunked loss included), every predictor's matrix products; on a CPU torch's counter does not count
    attention scores, which `forward_flops` leaves out too."""
    from torch.utils.flop_counter import FlopCounterMode

    model = mtp_model("gpt2", form, num_future=2)
    ids = torch.randint(0, VOCAB, (2, 10), generator=torch.Generator().manual_seed(0))
    inputs = HeadInputs(hidden=torch.randn(2, 10, 32), embeddings=model.output_embedding_matrix(), token_ids=ids)
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model.head(inputs, ids)
    assert counter.get_total_flops() == model.head.forward_flops(20)
    assert model.head.forward_flops(20) > 3 * model.head.shared.forward_flops(20)  # the predictors count


def test_short_sequences_and_ignored_labels_stay_finite():
    """Sequences no longer than the future depth, and batches whose labels are all ignored: finite losses
    and gradients (a depth without labels adds 0); a one-token prompt drafts and decodes as plain greedy."""
    model = mtp_model(num_future=3).train()
    for ids, labels in [(torch.tensor([[5, 6]]), torch.tensor([[5, 6]])),
                        (torch.tensor([[5, 6, 7, 8]]), torch.full((1, 4), -100))]:
        out = model(input_ids=ids, labels=labels)
        out.loss.backward()
        assert torch.isfinite(out.loss) and all(torch.isfinite(v) for v in out.aux_terms.values())
        assert all(p.grad is None or torch.isfinite(p.grad).all() for p in model.parameters())
    model.eval()
    prompt = torch.tensor([[7]])
    assert torch.equal(model.generate(prompt, max_new_tokens=8, do_sample=False, use_mtp=True),
                       model.generate(prompt, max_new_tokens=8, do_sample=False))


def test_self_distillation_trains_the_predictors_alone_and_raises_acceptance(tmp_path):
    """`hf_outheads.training.mtp_distill`: the predictors learn the model's own greedy continuations (labels on the
    continuations only), trained by train.py's loop; the next-token model keeps every value, the saved config
    its dropout rates, and drafting on those prompts keeps more of its drafts than before."""
    from transformers import AutoModelForCausalLM

    from hf_outheads.training.mtp_distill import DistillOptions, distill, greedy_examples
    from hf_outheads.training.tokenization import train_tokenizer

    model = mtp_model(num_future=2, seed=1)
    prompts = torch.randint(3, VOCAB, (32, 5), generator=torch.Generator().manual_seed(5))
    eos = model.generation_config.eos_token_id
    examples = greedy_examples(model, prompts, 12, 8, 0, eos)
    plain = model.generate(prompts[:1], max_new_tokens=12, do_sample=False, pad_token_id=0)
    assert torch.equal(examples["input_ids"][:1, : plain.shape[1]], plain)  # batched greedy is greedy
    assert (examples["labels"][:, :5] == -100).all() and (examples["labels"][:, 5:] != -100).any()

    def kept_share(model):
        accepted = proposed = 0
        for prompt in prompts[:8].split(1):
            model.generate(prompt, max_new_tokens=12, do_sample=False, pad_token_id=0, use_mtp=True)
            accepted, proposed = accepted + sum(model.head.draft_counts.accepted), proposed + sum(model.head.draft_counts.proposed)
        return accepted / proposed

    kept = kept_share(model)
    run = tmp_path / "run"
    model.save_pretrained(run)  # (a wordlevel tokenizer's special ids are the model's: <pad> 0, <s> 1, </s> 2)
    train_tokenizer(["every word of a tiny text"], "wordlevel", 10, min_frequency=1).save_pretrained(run)
    predictors = {name: p.detach().clone() for name, p in model.named_parameters() if name.startswith("head.predictors.")}
    with torch.no_grad():
        logits = model(examples["input_ids"]).logits
    settings = DistillOptions(batch_size=8, max_steps=150, learning_rate=1e-2, seed=0, new_tokens=12)
    result = distill(run, examples, tmp_path / "out", settings)
    assert all(result["losses_after"][k] < result["losses_before"][k] - 0.5 for k in result["losses_before"]), result
    assert result["trained_parameters"] == sum(p.numel() for p in predictors.values())
    trained = AutoModelForCausalLM.from_pretrained(tmp_path / "out")
    assert all(torch.equal(p, dict(model.named_parameters())[name]) for name, p in trained.named_parameters()
               if name not in predictors)
    assert all(not torch.equal(dict(trained.named_parameters())[name], p) for name, p in predictors.items())
    assert trained.config.text_config.attention_dropout == model.config.text_config.attention_dropout
    with torch.no_grad():
        assert torch.equal(trained(examples["input_ids"]).logits, logits)
    after = kept_share(trained)
    assert after > kept + 0.1, (kept, after)