"""Self-speculative decoding with the `mtp` head: `model.generate(..., use_mtp=True)` runs
transformers' assisted decoding (`GenerationMixin._assisted_decoding`) with `FutureDrafts` as its
candidate generator. Each round the future predictors draft D tokens from the backbone states of
the last verified positions; transformers' loop verifies them with the next-token head in one
forward over the drafts with the KV cache, keeps the longest agreeing prefix plus the next-token
head's own token, and crops the cache. Greedy decoding keeps a draft only where it is the
next-token head's argmax, so its tokens are those of plain greedy decoding; sampling accepts a draft
with probability min(1, p / q) (speculative sampling, Leviathan et al. 2023), so its tokens follow
the next-token head's distribution. transformers runs assisted decoding for one sequence at a time.
Drafts score the head's draft vocabulary (`draft_vocab_size`, else every word) through the shared
head's `word_scorer`, whose label rows are taken once per `generate` call.

Bookkeeping of the sequential form (DeepSeek-V3 Eq. 21-22): after a round the sequence holds
tokens x_0..x_L, and the backbone's states h^0 are known up to position L - 1. Depth k at position t
reads h^{k-1}_t and x_{t+k}, so its states are exact (from verified tokens) up to position L - k;
its cache keeps those. To draft, depth k also runs positions L - k + 1 .. L - 1, whose tokens ahead
are the drafts of the lower depths, takes its draft from position L - 1, and crops them again.
Depth k's exact outputs that depth k + 1 has not read yet are kept for the next round. The
independent form's depths all read h^0 only, so their caches only ever hold exact positions.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from transformers.generation.candidate_generator import CandidateGenerator

from .future_blocks import BlockCache


@dataclass
class DraftCounts:
    """Per future position j = 1..D: drafts proposed and accepted (a draft at j is accepted when
    the first j drafts of its round are), over one `generate` call; `rounds` verification forwards,
    `tokens` tokens they added."""

    proposed: list[int]
    accepted: list[int]
    rounds: int = 0
    tokens: int = 0

    @classmethod
    def empty(cls, depth: int) -> "DraftCounts":
        return cls([0] * depth, [0] * depth)

    def add(self, other: "DraftCounts") -> None:
        self.proposed = [a + b for a, b in zip(self.proposed, other.proposed)]
        self.accepted = [a + b for a, b in zip(self.accepted, other.accepted)]
        self.rounds, self.tokens = self.rounds + other.rounds, self.tokens + other.tokens

    def acceptance(self) -> list[float | None]:
        """Accepted / proposed per future position (None where nothing was proposed)."""
        return [a / p if p else None for a, p in zip(self.accepted, self.proposed)]


@dataclass
class FutureDrafts(CandidateGenerator):
    """transformers' `CandidateGenerator` protocol for drafts computed from the main model's outputs
    (`requires_model_outputs`, as its own `MTPCandidateGenerator`): the first call returns no draft,
    so that the prompt's forward runs first; later calls read the backbone's last states of the
    verified positions from `model_outputs.hidden_states[-1]`: each verification forward asks for the
    final states alone (`output_hidden_states=-1`), or for every layer where the caller asked for them
    (`generate(output_hidden_states=True)`), which hold the final states too. Counts drafts in `head.draft_counts`.
    `prompt_embeds`: the leading prompt positions given only as embeddings (`generate(inputs_embeds=...)`,
    whose `input_ids` then hold the generated tokens alone), `(1, P, d)`, or None: positions count from
    the first of them, and the sequential form reads their rows as the tokens ahead (the rows the
    backbone read there; the training path reads `E`'s row of each token, which they are for
    `inputs_embeds = model.get_input_embeddings()(ids)` on most backbones)."""

    model: object
    head: object
    generation_config: object
    logits_processor: object = None
    prompt_embeds: torch.Tensor | None = None
    requires_model_outputs = True
    model_kwargs_overrides: dict = field(init=False)
    caches: list = field(init=False)

    def __post_init__(self):
        if self.model.config.is_encoder_decoder:
            raise ValueError("Head 'mtp': use_mtp=True drafts for decoder-only (causal) models; generate with this "
                             "seq2seq model without it.")
        wanted = self.generation_config.output_hidden_states
        if wanted not in (None, False, True):
            raise ValueError(f"Head 'mtp': use_mtp=True returns the hidden states of every layer or of none, not "
                             f"output_hidden_states={wanted!r}: transformers' assisted decoding splits each returned "
                             "layer per token. Pass output_hidden_states=True, or generate without use_mtp.")
        # the final states only (no capture: see the model's forward), unless the caller asked for every layer
        self.model_kwargs_overrides = {} if wanted else {"output_hidden_states": -1}
        depth = len(self.head.predictors)
        self.caches = [BlockCache() for _ in range(depth)]
        self.unread = [None] * depth  # unread[k]: depth k's exact outputs that depth k + 1 has not read yet
        self.seen = 0  # positions whose backbone state the predictors have read
        self.embeddings = self.model.output_embedding_matrix().detach()
        self.rows = self.head.draft_tokens  # the draft vocabulary (None: every word)
        self.score = self.head.shared.word_scorer(self.embeddings, self.rows)  # its label rows taken once
        self.head.draft_counts = self.counts = DraftCounts.empty(depth)
        self.sequential = self.head.options.form == "sequential"
        self.drafted = 0
        self.offset = 0 if self.prompt_embeds is None else self.prompt_embeds.shape[1]  # positions before input_ids
        if self.offset:
            self.prompt_embeds = self.prompt_embeds.detach().to(self.embeddings.dtype)

    @torch.no_grad()
    def get_candidates(self, input_ids, model_kwargs=None, model_outputs=None, is_first_iteration=False,
                       n_last_matches=0, **kwargs):
        if is_first_iteration:  # the prompt's forward first: the predictors read its states
            return input_ids, None
        last = self.offset + input_ids.shape[1] - 1
        states = model_outputs.hidden_states[-1][:, : last - self.seen] * self.model.config.hidden_scale
        self.seen = last
        tokens, scores = self.draft(input_ids, states)
        self.drafted = max(0, min(len(tokens), self.generation_config.max_length - input_ids.shape[1] - 1))
        if not self.drafted:
            return input_ids, None
        scores = torch.cat(scores[: self.drafted], dim=1) if self.generation_config.do_sample else None
        return torch.cat([input_ids, *tokens[: self.drafted]], dim=1), scores

    def draft(self, input_ids: torch.Tensor, states: torch.Tensor) -> tuple[list, list]:
        """One token per depth from position L - 1 (L = the last verified token's index), advancing
        every depth's cache to its exact positions (see the module docstring)."""
        last, ids = self.offset + input_ids.shape[1] - 1, input_ids
        stream, tokens, scores = states, [], []
        for k, predictor in enumerate(self.head.predictors, start=1):
            cache = self.caches[k - 1]
            start = len(cache)
            if predictor.merge is None:
                out = predictor(states, cache=cache)
            else:
                ahead = self.input_rows(ids, start + k, last + k)
                out = predictor(stream, ahead, cache)
            token, score = self.choose(ids, predictor.norm(out[:, -1:]))
            tokens.append(token)
            scores.append(score)
            ids = torch.cat([ids, token], dim=1)
            if predictor.merge is None:
                continue
            exact = max(0, last - k + 1)
            cache.crop(exact)
            if k < len(self.caches):  # depth k's states over depth k + 1's positions, and the ones it keeps
                stream = out if self.unread[k] is None else torch.cat([self.unread[k], out], dim=1)
                offset = max(0, last - k) - len(self.caches[k])
                self.unread[k] = stream[:, offset : offset + exact - max(0, last - k)]
        return tokens, scores

    def input_rows(self, ids: torch.Tensor, start: int, stop: int) -> torch.Tensor:
        """The input rows of positions [start, stop): `prompt_embeds`' before `offset`, `E`'s rows of the ids after."""
        offset = self.offset
        rows = F.embedding(ids[:, max(start - offset, 0) : max(stop - offset, 0)], self.embeddings)
        if start >= offset:
            return rows
        return torch.cat([self.prompt_embeds[:, start : min(stop, offset)], rows], dim=1)

    def choose(self, ids: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The draft from one normalised state through the shared head's scores of the draft vocabulary:
        the processed scores (the generation's logits processors, as the verification applies them;
        over every word, -inf outside the draft vocabulary, when sampling or processing) and their argmax
        or sample."""
        scores = self.score(state[:, -1]).float()
        spread = self.rows is not None and (self.generation_config.do_sample or bool(self.logits_processor))
        if spread:
            scores = scores.new_full((scores.shape[0], self.head.dims.vocab_size), float("-inf")).index_copy_(
                1, self.rows, scores)
        if self.logits_processor:
            scores = self.logits_processor(ids, scores)
        if self.generation_config.do_sample:
            token = torch.multinomial(scores.softmax(-1), num_samples=1)
        else:
            token = scores.argmax(-1, keepdim=True)
        if self.rows is not None and not spread:
            token = self.rows[token]
        return token, scores[:, None]

    def update_candidate_strategy(self, input_ids, scores, num_matches):
        counts = self.counts
        for j in range(self.drafted):
            counts.proposed[j] += 1
            counts.accepted[j] += int(num_matches > j)
        counts.rounds += 1
        counts.tokens += int(num_matches) + 1
