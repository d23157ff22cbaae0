"""`lightrnn`: HybridLightRNN(-MoS) code-table head: exact normalisation with empty codes, the
gold-code loss, the table (bijection, exclusive frequent words, re-assignment never worse,
saved and carried by remote code), generation, the mixture, resizing and validation."""

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from hf_outheads import OutHeadsConfig, OutHeadsForCausalLM
from hf_outheads.lightrnn_table import check_codes, grid_cost, reassign, table_grid
from hf_outheads.head_lightrnn import LightRNNHead, LightRNNOptions
from hf_outheads.head_interface import HeadDims, HeadInputs
from tiny import VOCAB, batch, tiny_config, tiny_model

TABLE = {"num_exclusive": 8, "num_rows": 8, "num_columns": 16}  # 37 empty cells, rows 6 and 7 empty
DIMS = HeadDims(vocab_size=VOCAB, embed_dim=32, hidden_dim=32, num_layers=2)


def head(seed=0, dims=DIMS, **options):
    torch.manual_seed(seed)
    h = LightRNNHead(LightRNNOptions(**{**TABLE, **options}).resolve(dims), dims)
    h.reset_parameters()
    return h


def inputs(n=40, seed=1, shape=None):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(*(shape or (n,)), 32, generator=g)
    return HeadInputs(hidden, torch.randn(VOCAB, 32, generator=g))


def assert_normalised(logits):
    torch.testing.assert_close(logits.logsumexp(-1), torch.zeros(logits.shape[:-1]), atol=1e-5, rtol=0)


def test_shape_resolved_and_validated():
    config = OutHeadsConfig(text_config=tiny_config("llama"), head_type="lightrnn")
    options = config.head_options
    f, r, c = options["num_exclusive"], options["num_rows"], options["num_columns"]
    assert (f, c, r) == (49, 8, 7) and f + r * c >= VOCAB  # min(4096, V // 2), ceil(sqrt(50)), ceil(50 / 8)
    with pytest.raises(ValueError, match="cannot hold"):
        OutHeadsConfig(text_config=tiny_config("llama"), head_type="lightrnn",
                       head_options={"num_exclusive": 8, "num_rows": 5, "num_columns": 16})
    with pytest.raises(ValueError, match="table_init"):
        OutHeadsConfig(text_config=tiny_config("llama"), head_type="lightrnn", head_options={"table_init": "alpha"})


@pytest.mark.parametrize("options", [{}, {"num_components": 3}, {"tied": True, "latent_activation": "identity"},
                                     {"num_exclusive": 0, "num_rows": 10, "num_columns": 10}])
def test_log_probs_normalise_with_empty_codes_and_gold_loss_matches(options):
    h = head(**options).train()  # no dropout: the two training paths see the same latents
    x, labels = inputs(), torch.randint(0, VOCAB, (40,), generator=torch.Generator().manual_seed(2))
    labels[::7] = -100
    full = h(HeadInputs(x.hidden, x.embeddings, return_logits=True), labels)
    assert_normalised(full.logits)
    gold = h(x, labels)  # training with labels: gold codes only
    assert gold.logits is None
    keep = labels != -100
    want = -full.logits[keep].gather(1, labels[keep, None]).sum()
    torch.testing.assert_close(gold.nll_sum, want, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(full.nll_sum, want, rtol=1e-5, atol=1e-4)
    grads = torch.autograd.grad(gold.nll_sum, list(h.parameters()), allow_unused=True)
    assert all(g is None or torch.isfinite(g).all() for g in grads)
    unused = torch.ones(h.table[0] + h.table[1] * h.table[2], dtype=torch.bool)
    unused[h.codes] = False
    assert unused.sum() == h.table[0] + h.table[1] * h.table[2] - VOCAB > 0  # empty codes exist


def test_mixture_of_identical_components_is_the_single_head():
    one, three = head(num_components=1).eval(), head(num_components=3, seed=5).eval()
    with torch.no_grad():
        for name in ("first_weight", "first_bias", "row_embedding", "second_weight", "second_bias"):
            getattr(three, name).copy_(getattr(one, name))
        for mine, theirs in ((three.latents[0], one.latents[0]), (three.column_latents, one.column_latents)):
            mine.weight.copy_(theirs.weight.repeat(3, 1))
            mine.bias.copy_(theirs.bias.repeat(3))
        x = inputs(shape=(2, 5))
        single, mixed = one(x).logits, three(x).logits
    assert_normalised(mixed)
    torch.testing.assert_close(mixed, single, rtol=1e-5, atol=1e-5)


def test_frequent_words_exclusive_and_set_word_counts_keeps_learnt_tables():
    h = head()
    counts = torch.randint(0, 1000, (VOCAB,), generator=torch.Generator().manual_seed(3)).float()
    h.set_word_counts(counts)
    top = torch.argsort(-counts, stable=True)
    assert torch.equal(h.codes[top[:8]], torch.arange(8))  # the 8 most frequent words, in order
    assert (h.codes[top[8:]] >= 8).all() and torch.equal(h.codes[top[8:]], torch.sort(h.codes[top[8:]]).values)
    check_codes(h.codes, 8 + 8 * 16)
    initialised = h.codes.clone()
    h.set_word_counts(torch.ones(VOCAB))  # no longer the default table: kept
    assert torch.equal(h.codes, initialised)
    h.init_table_from_counts(counts, order="random")
    assert torch.equal(h.codes[top[:8]], torch.arange(8)) and not torch.equal(h.codes, initialised)
    check_codes(h.codes, 8 + 8 * 16)


@pytest.mark.parametrize("method", ["exact", "alternating"])
def test_reassignment_never_worse_on_random_costs(method):
    rng = np.random.default_rng(0)
    for trial in range(20):
        R, C = rng.integers(2, 7, size=2)
        n = int(rng.integers(1, R * C + 1))
        grid = np.full(R * C, -1)
        grid[rng.permutation(R * C)[:n]] = np.arange(n) + 3  # words 3.., some cells empty
        grid = grid.reshape(R, C)
        row_cost, col_cost = rng.random((n + 3, R)) * 10, rng.random((n + 3, C)) * 10
        new, stats = reassign(grid, row_cost, col_cost, method)
        assert sorted(new[new >= 0]) == sorted(grid[grid >= 0])  # same words, one per cell
        assert stats["cost_after"] <= stats["cost_before"] == pytest.approx(grid_cost(grid, row_cost, col_cost))
        assert stats["cost_after"] == pytest.approx(grid_cost(new, row_cost, col_cost))
        if method == "alternating":
            exact = reassign(grid, row_cost, col_cost, "exact")[1]["cost_after"]
            assert exact <= stats["cost_after"] + 1e-9
        assert not reassign(new, row_cost, col_cost, method)[1]["moved"] or method == "alternating"


def test_costs_at_the_current_table_sum_to_the_nll_and_reassignment_keeps_a_bijection():
    full = {"num_exclusive": 3, "num_rows": 8, "num_columns": 12, "num_components": 3}  # 3 + 96 = 99: no empty code
    h = head(**full).eval()
    x, labels = inputs(200), torch.randint(0, VOCAB, (200,), generator=torch.Generator().manual_seed(4))
    assert h.reassign_codes() == {"tokens": 0, "moved": 0}
    h.accumulate_code_costs(x, labels)
    row_cost, col_cost, tokens = h._costs
    grid = table_grid(h.codes, *h.table)
    table = h.codes[labels] >= 3
    with torch.no_grad():
        nll = -h(x).logits[table].gather(1, labels[table, None]).sum().item()
    assert tokens == int(table.sum())
    assert grid_cost(grid, row_cost.double().numpy(), col_cost.double().numpy()) == pytest.approx(nll, rel=1e-5)
    before = h.codes.clone()
    stats = h.reassign_codes()  # 96 x 96: exact
    assert stats["method"] == "exact" and stats["cost_after"] <= stats["cost_before"] and stats["moved"] > 0
    check_codes(h.codes, 99)
    assert torch.equal(h.codes[:3], before[:3])  # exclusive words stay
    assert_normalised(h(x).logits)
    h.accumulate_code_costs(x, labels)
    stats = h.reassign_codes(method="alternating")
    assert stats["cost_after"] <= stats["cost_before"]
    check_codes(h.codes, 99)


def trained_with_reassignment(backbone="llama", steps=6):
    model = tiny_model(backbone, "lightrnn", {**TABLE, "num_components": 2})
    model.head.set_word_counts(torch.arange(VOCAB, 0, -1).float().roll(7))  # a non-default table
    model.head.track_code_costs(True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model.train()
    data, results = batch(backbone, batch_size=4, length=12), []
    for _ in range(steps):
        optimizer.zero_grad()
        model(**data).loss.backward()
        optimizer.step()
    results.append(model.head.reassign_codes(method="alternating"))
    model(**data, return_logits=True).loss.backward()  # the logits path accumulates too
    results.append(model.head.reassign_codes())
    return model.eval(), results


def test_training_with_reassignment_then_generate_save_and_remote_load(tmp_path):
    model, results = trained_with_reassignment()
    assert all(r["tokens"] > 0 and r["cost_after"] <= r["cost_before"] for r in results), results
    assert any(r["moved"] for r in results)
    check_codes(model.head.codes, 8 + 8 * 16)
    prompt = batch("llama")["input_ids"]
    greedy = model.generate(prompt, max_new_tokens=4, min_new_tokens=4, do_sample=False)
    beams = model.generate(prompt, max_new_tokens=4, min_new_tokens=4, num_beams=3, num_return_sequences=2,
                           do_sample=False, output_scores=True, return_dict_in_generate=True)
    assert greedy.shape == (2, 11) and beams.sequences.shape[0] == 4 and (beams.sequences_scores <= 0).all()
    model.save_pretrained(tmp_path)
    with torch.no_grad():
        want = model(input_ids=prompt).logits
    assert_normalised(want)
    reloaded = OutHeadsForCausalLM.from_pretrained(tmp_path).eval()
    assert torch.equal(reloaded.head.codes, model.head.codes)
    with torch.no_grad():
        assert torch.equal(reloaded(input_ids=prompt).logits, want)
    torch.save({"input_ids": prompt}, tmp_path / "inputs.pt")
    torch.save(model.head.codes, tmp_path / "codes.pt")
    script = ("import sys; sys.modules['hf_outheads'] = None\nimport torch, transformers\n"
              "m = transformers.AutoModelForCausalLM.from_pretrained(sys.argv[1], trust_remote_code=True).eval()\n"
              "assert torch.equal(m.head.codes, torch.load(sys.argv[1] + '/codes.pt'))\n"
              "with torch.no_grad(): logits = m(**torch.load(sys.argv[1] + '/inputs.pt')).logits\n"
              "torch.save(logits, sys.argv[1] + '/remote.pt')\n"
              "print(type(m).__module__)")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(HF_HUB_OFFLINE="1", HF_MODULES_CACHE=str(tmp_path / "modules"))
    run = subprocess.run([sys.executable, "-c", script, str(tmp_path)], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip().startswith("transformers_modules.")
    assert torch.equal(torch.load(tmp_path / "remote.pt"), want)


def test_seq2seq_generates_and_costs_are_tracked_only_when_asked():
    model = tiny_model("t5", "lightrnn", {**TABLE, "num_components": 2})
    model.train()
    model(**batch("t5")).loss.backward()
    assert model.head._costs is None
    model.head.track_code_costs(True)
    model(**batch("t5")).loss.backward()
    tokens = model.head._costs[2]
    assert tokens > 0
    model.eval()
    with torch.no_grad():  # evaluation never feeds the table's costs, whichever path it takes
        assert model(**batch("t5"), return_logits=False).logits is None and model(**batch("t5")).logits is not None
    assert model.head._costs[2] == tokens
    out = model.generate(batch("t5")["input_ids"], max_new_tokens=3, num_beams=2, do_sample=False)
    assert out.shape[0] == 2


def test_resize_frees_and_takes_codes():
    h = head()
    codes = h.codes.clone()
    h.resize_vocab(90)
    assert torch.equal(h.codes, codes[:90])
    h.resize_vocab(99 + 37)  # fills every free code
    check_codes(h.codes, 136)
    assert torch.equal(h.codes[:90], codes[:90]) and h.codes.numel() == 136
    assert_normalised(h.eval()(HeadInputs(torch.randn(3, 32), torch.randn(136, 32))).logits)
    with pytest.raises(ValueError, match="larger num_rows"):
        h.resize_vocab(137)


@pytest.mark.parametrize("activation", ["identity", "tanh"])
def test_conversion_from_a_pretrained_lm_starts_close(activation):
    """Exclusive words keep the original's odds against each other, also after `set_word_counts`
    replaces the default table (as train.py does after building the model): the code parameters
    follow their words."""
    from tiny import tiny_original

    original = tiny_original("gpt2")
    model = OutHeadsForCausalLM.from_backbone(original, head_type="lightrnn",
                                              head_options={**TABLE, "latent_activation": activation})
    ids = batch("gpt2")["input_ids"]
    tol = 1e-3 if activation == "identity" else 5e-2  # tanh(eps x) / eps is x to O(eps^2)

    def check():
        with torch.no_grad():
            ours, theirs = model(input_ids=ids).logits, original(input_ids=ids).logits.log_softmax(-1)
        assert_normalised(ours)
        exclusive = model.head.codes < 8
        diff = (ours - theirs)[..., exclusive]
        torch.testing.assert_close(diff - diff[..., :1], torch.zeros_like(diff), atol=tol, rtol=0)

    check()
    before = model.head.codes.clone()
    model.head.set_word_counts(torch.rand(model.config.vocab_size))
    assert not torch.equal(model.head.codes[before < 8], before[before < 8])  # other words are exclusive now
    check()
    model.train()(input_ids=ids, labels=ids).loss.backward()  # every part of the converted head can learn
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.head.parameters())


def test_training_loss_never_builds_a_tensor_per_position_and_word():
    """Gold-code loss at |V| = 1M: no op output (forward or backward) is N x |V|; only O(|V|)
    work per batch (the table's masks). (Tracking costs adds `|V| x (R + C)` accumulators.)"""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Largest(TorchDispatchMode):
        largest = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, (tuple, list)) else [out]:
                if isinstance(t, torch.Tensor):
                    Largest.largest = max(Largest.largest, t.numel())
            return out

    V, n = 1_000_000, 64
    big = head(dims=HeadDims(V, 32, 32, 2), num_exclusive=None, num_rows=None, num_columns=None, num_components=3)
    big.train()
    x = HeadInputs(torch.randn(n, 32, requires_grad=True), torch.randn(1, 32))
    with Largest():
        out = big(x, torch.randint(0, V, (n,)))
        out.nll_sum.backward()
    assert out.logits is None and torch.isfinite(out.nll_sum)
    assert Largest.largest <= 2 * V < n * V


def test_latent_init_is_obeyed():
    """`latent_init` was ignored (the maps always took torch's Linear init): "identity" now starts
    them at `I + N(0, 0.02^2)` as `mos`'s; the default stays the measured Linear init."""
    from tiny import tiny_model

    options = {"num_components": 2, "num_exclusive": 8, "num_rows": 8, "num_columns": 16}
    uniform = tiny_model("gpt2", "lightrnn", options).head
    identity = tiny_model("gpt2", "lightrnn", {**options, "latent_init": "identity"}).head
    assert uniform.options.latent_init == "uniform"
    eye = torch.eye(32).repeat(2, 1)
    offset = identity.latents[0].weight - eye
    assert offset.std() < 0.03 and offset.abs().max() < 0.2 and torch.count_nonzero(identity.prior.weight) == 0
    assert (uniform.latents[0].weight - eye).abs().max() > 0.5
