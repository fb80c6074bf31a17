"""Masking strategies: small pure functions on torch tensors, identical on CPU and CUDA.

Every strategy takes a collated batch (`maskstream.trainer.collate.collate_sequences`) and returns a new
dict whose `input_ids` are corrupted and whose `labels` hold the original id at each chosen
position and -100 elsewhere. Special tokens and padding are never chosen.

Determinism: no torch generator is used. Every random number is a counter-based hash
(splitmix64, in int64 tensor arithmetic) of (seed, epoch, global sample index, stream,
position), so a sample's mask is a pure function of (seed, epoch, sample index) and of its own
tokens: it does not depend on the batch it lands in, the number of ranks or loader workers, or
the device. The only floating-point transcendental is `log` (exponential-race keys of the
whole-word variants); elsewhere uniforms are compared exactly, so CPU and CUDA agree bit for bit
except for a `log` rounding difference deciding a near-tie (about 1e-15 per pair of words).

Strategies (the budget is `round(budget * non-special tokens)` per sequence, half to even):

- `random`: BERT. Each non-special token is chosen independently with probability `budget`.
- `whole_word`: words (`word_ids`) taken in a uniformly random order until the chosen words hold
  at least the budget of tokens; all tokens of a chosen word are masked.
- `span`: SpanBERT. Spans of whole words, length ~ Geometric(p = 0.2) truncated at 10 words
  (mean 3.8), uniformly placed; a span is kept if it still fits in the budget. Up to
  `2 * budget + 10` spans are tried per sequence. 80/10/10 is decided per span, as in SpanBERT.
- `difference`: exactly the budget of tokens, drawn without replacement so that each token's
  inclusion probability is its stored `mask_probability` (rescaled to sum to the budget):
  randomized systematic sampling (a random order from `random_order`, no sort, then one uniform
  start on the cumulative probabilities), one vectorized step. Token-level Gumbel top-k (the
  reference code's `np.random.choice(replace=False, p=...)` distribution) also draws exactly the
  budget, but its inclusion probabilities are not proportional to the weights (up to 14% off
  on real sequences); the stored probabilities are expected masking rates. With `whole_word=True`, words are ranked by an
  exponential race on their summed probability (Gumbel top-k over log weights, in its
  equivalent form `-log(u) / weight`) and taken in that order until they hold at least the
  budget of tokens; all tokens of a chosen word are masked. A token (or word) of probability 0
  is never chosen: a sequence with fewer than the budget of tokens of p > 0 gets all of those and
  no more (the build reports such sequences as its budget shortfall; a sequence of all zeros is
  drawn uniformly).
- `pmi_span` (PMI-Masking, Levine et al. 2021): the units of `span_ids` (a collocation of the
  version's vocabulary is one unit, every other word one unit) in a uniformly random order, taken
  as `whole_word` takes words; `difference_pmi_span` orders them by an exponential race on their
  summed `mask_probability` instead. 80/10/10 is decided per token, as in BERT.
- `informask` (InforMask, Sadeq et al. 2022): as `difference`, with each token's word's
  `informativeness` weight in place of `mask_probability`; tokens of weight 0 (punctuation, words
  the word table lacks) only fill a sequence whose weighted tokens are fewer than its budget.
- `tmr`: Token Masking Regularization for fine-tuning: each non-special token becomes
  `[MASK]` with probability `tmr_probability`; no random or kept tokens.

Chosen tokens (all strategies but `tmr`) become `[MASK]` / a random non-special token / stay
unchanged with probabilities `mask_replace` / `random_replace` / the rest (0.8 / 0.1 / 0.1).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from typing import Any

import torch

from maskstream.mask_signal.probability import check_budget, scale_to_budget
from maskstream.trainer.strategies import STRATEGIES, check_strategy

_MASK64 = (1 << 64) - 1


def _int64(value: int) -> int:
    """The int64 with the same 64 bits as the unsigned `value`."""
    value &= _MASK64
    return value - (1 << 64) if value >= 1 << 63 else value


_GOLDEN = _int64(0x9E3779B97F4A7C15)
_MIX1 = _int64(0xBF58476D1CE4E5B9)
_MIX2 = _int64(0x94D049BB133111EB)

# One constant per use of randomness, so that the streams are independent.
_STREAM_CHOOSE = 1
_STREAM_ORDER = 2
_STREAM_WORD_RACE = 3
_STREAM_ACTION = 4
_STREAM_SPAN_ACTION = 5
_STREAM_SPAN_START = 6
_STREAM_SPAN_LENGTH = 7


def splitmix64(value: int) -> int:
    """The splitmix64 finalizer on a Python int (the reference the tensor version is checked against)."""
    z = value & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def _shift_right(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of int64 bit patterns (torch's `>>` is arithmetic)."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def mix64(x: torch.Tensor) -> torch.Tensor:
    """splitmix64's finalizer on int64 tensors (multiplication wraps modulo 2**64)."""
    x = x ^ _shift_right(x, 30)
    x = x * _MIX1
    x = x ^ _shift_right(x, 27)
    x = x * _MIX2
    return x ^ _shift_right(x, 31)


def sample_keys(sample_index: torch.Tensor, seed: int, epoch: int) -> torch.Tensor:
    """One int64 key per sample: a hash of (seed, epoch, global sample index)."""
    base = _int64(splitmix64(splitmix64(seed * 0x9E3779B97F4A7C15 + 1) ^ (epoch & _MASK64)))
    return mix64(sample_index.to(torch.int64) * _GOLDEN + base)


def _hash(keys: torch.Tensor, stream: int, counters: torch.Tensor) -> torch.Tensor:
    """int64 hash per (sample key, stream, counter); `counters` broadcast against `keys[:, None]`."""
    stream_keys = mix64(keys ^ _int64(stream * 0xD1B54A32D192ED03))
    return mix64(stream_keys[:, None] + counters * _GOLDEN)


def _unit(bits: torch.Tensor, width: int) -> torch.Tensor:
    """float64 in (0, 1) from `width` (<= 53) random bits held in a non-negative int64."""
    return (bits.to(torch.float64) + 0.5) * (2.0**-width)


def _uniform(keys: torch.Tensor, stream: int, counters: torch.Tensor) -> torch.Tensor:
    """float64 uniforms in (0, 1), 53 random bits each."""
    return _unit(_shift_right(_hash(keys, stream, counters), 11), 53)


def _positions(batch: dict[str, torch.Tensor]) -> torch.Tensor:
    input_ids = batch["input_ids"]
    return torch.arange(input_ids.shape[1], device=input_ids.device, dtype=torch.int64)[None, :]


@dataclasses.dataclass(frozen=True)
class MaskingConfig:
    """How much to mask and with what. Token ids come from the dataset's tokenizer (`from_manifest`).

    mask_token_id: the tokenizer's [MASK] id. vocab_size: the vocabulary's size (random replacements
    are drawn from it). special_token_ids: ids never masked and never drawn as replacements. budget:
    the share of a sequence's maskable tokens to mask (0.15). mask_replace / random_replace: the
    shares of chosen tokens that become [MASK] / a random token, the rest staying as they are
    (0.8 / 0.1, BERT's 80/10/10). span_p / span_max: `span`'s geometric span-length parameter and
    longest span in words (0.2 / 10, SpanBERT). tmr_probability: `tmr`'s chance of [MASK] per token
    (0.1). whole_word: with `difference`, mask every token of each chosen word.
    """

    mask_token_id: int
    vocab_size: int
    special_token_ids: tuple[int, ...]
    budget: float = 0.15
    mask_replace: float = 0.8
    random_replace: float = 0.1
    span_p: float = 0.2
    span_max: int = 10
    tmr_probability: float = 0.1
    whole_word: bool = False  # for `difference`

    def __post_init__(self) -> None:
        check_budget(self.budget, "budget")
        if self.mask_replace < 0 or self.random_replace < 0 or self.mask_replace + self.random_replace > 1:
            raise ValueError("mask_replace and random_replace must be >= 0 and sum to at most 1")
        if not 0.0 < self.span_p <= 1.0 or self.span_max < 1:
            raise ValueError("span_p must be in (0, 1] and span_max >= 1")
        if not 0.0 <= self.tmr_probability <= 1.0:
            raise ValueError(f"tmr_probability must be in [0, 1], got {self.tmr_probability}")
        if len(set(self.special_token_ids)) >= self.vocab_size:
            raise ValueError("the vocabulary has no non-special token to draw random replacements from")

    @classmethod
    def from_manifest(cls, manifest: Any, **overrides: Any) -> MaskingConfig:
        """The config for a dataset version: token ids from `manifest.tokenizer`, the rest from
        `overrides` (e.g. `budget=manifest.config["budget"]`, `whole_word=True`)."""
        tokenizer = manifest.tokenizer
        missing = [k for k in ("mask_token_id", "vocab_size", "all_special_ids") if k not in tokenizer]
        if missing:
            raise ValueError(f"manifest tokenizer entry lacks {missing}; it has {sorted(tokenizer)}")
        if tokenizer["mask_token_id"] is None:
            raise ValueError(f"the dataset's tokenizer {tokenizer.get('name')} has no mask token: MLM masking needs one")
        return cls(
            mask_token_id=int(tokenizer["mask_token_id"]),
            vocab_size=int(tokenizer["vocab_size"]),
            special_token_ids=tuple(sorted({int(i) for i in tokenizer["all_special_ids"]})),
            **overrides,
        )

    @classmethod
    def from_tokenizer(cls, tokenizer: Any, **overrides: Any) -> MaskingConfig:
        """The config for a Hugging Face tokenizer (tests and benchmarks)."""
        if tokenizer.mask_token_id is None:
            raise ValueError(f"tokenizer {tokenizer.name_or_path} has no mask token: MLM masking needs one")
        return cls(
            mask_token_id=int(tokenizer.mask_token_id),
            vocab_size=len(tokenizer),
            special_token_ids=tuple(sorted(set(tokenizer.all_special_ids))),
            **overrides,
        )


BUDGET_SCHEDULES = ("constant", "linear", "cosine")


@dataclasses.dataclass(frozen=True)
class BudgetSchedule:
    """The masking budget over a run's steps (`--mask-budget-schedule`): `constant` (the run's
    --mask-budget), `linear:START:END` or `cosine:START:END` from the first step (START) to the last
    (END); Ankner et al. 2023 decay 0.30 -> 0.15. Every strategy draws the step's budget."""

    kind: str = "constant"
    start: float = 0.15
    end: float = 0.15

    @classmethod
    def parse(cls, text: str, constant: float = 0.15) -> BudgetSchedule:
        kind, *bounds = text.split(":")
        if kind not in BUDGET_SCHEDULES or (kind == "constant") != (not bounds) or len(bounds) not in (0, 2):
            raise ValueError(f"--mask-budget-schedule {text!r}: use constant, linear:START:END or cosine:START:END")
        try:
            start, end = (float(b) for b in bounds) if bounds else (constant, constant)
        except ValueError:
            raise ValueError(f"--mask-budget-schedule {text!r}: START and END must be numbers") from None
        for bound in (start, end):
            check_budget(bound, f"--mask-budget-schedule {text!r}: START and END")
        return cls(kind, start, end)

    def __str__(self) -> str:
        """The flag's text, normalized (`linear:0.30:0.15` and `linear:0.3:0.15` are one schedule)."""
        return "constant" if self.kind == "constant" else f"{self.kind}:{self.start:g}:{self.end:g}"

    def at(self, done: int, total: int, unit: int = 1) -> float:
        """The budget of the step that starts with `done` of `total` trained, a step training `unit`
        (steps: `at(step, total_steps)`, 0 = the first; samples: the rows of a full step): the start
        budget at the first step, the end budget at the last."""
        fraction = min(max(done / max(total - unit, 1), 0.0), 1.0)
        if self.kind == "cosine":
            return self.end + (self.start - self.end) * (1.0 + math.cos(math.pi * fraction)) / 2.0
        return self.start + (self.end - self.start) * fraction  # constant: start == end


def maskable(batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Positions that may be chosen: real (attention 1), non-special tokens."""
    return batch["attention_mask"].bool() & ~batch["special_tokens_mask"].bool()


def budget_counts(can_mask: torch.Tensor, budget: float) -> torch.Tensor:
    """round(budget x maskable tokens) per sequence (float64 so CPU and CUDA round alike)."""
    return torch.round(can_mask.sum(dim=1).to(torch.float64) * budget).to(torch.int64)


@functools.lru_cache(maxsize=16)
def _special_shift_points(special_token_ids: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """Sorted distinct special ids minus their rank: the points where one more special id has been
    passed. Made once per device, not copied to it on every batch (a copy that would wait for
    the GPU)."""
    specials = torch.tensor(sorted(set(special_token_ids)), dtype=torch.int64)
    return (specials - torch.arange(specials.numel())).to(device)


def _random_tokens(bits: torch.Tensor, config: MaskingConfig) -> torch.Tensor:
    """Uniform draws from the non-special vocabulary, from 32 random bits each: an index among the
    allowed ids, then stepped over the special ids below it."""
    shift_points = _special_shift_points(tuple(config.special_token_ids), bits.device)
    draws = bits % (config.vocab_size - shift_points.numel())
    return draws + torch.searchsorted(shift_points, draws.contiguous(), right=True)


def corrupt(
    batch: dict[str, torch.Tensor],
    chosen: torch.Tensor,
    keys: torch.Tensor,
    config: MaskingConfig,
    action_counters: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """80/10/10: chosen tokens become [MASK], a random token, or stay. One hash per position gives
    the uniform that decides among the three (its high 32 bits; or a hash of `action_counters`,
    e.g. a span id, to decide per span) and the random token (its low 32 bits)."""
    input_ids = batch["input_ids"]
    bits = _hash(keys, _STREAM_ACTION, _positions(batch))
    if action_counters is None:
        action = _unit(_shift_right(bits, 32), 32)
    else:
        action = _uniform(keys, _STREAM_SPAN_ACTION, action_counters)
    to_mask = chosen & (action < config.mask_replace)
    to_random = chosen & ~to_mask & (action < config.mask_replace + config.random_replace)
    replacements = _random_tokens(bits & 0xFFFFFFFF, config).to(input_ids.dtype)
    corrupted = torch.where(to_mask, torch.full_like(input_ids, config.mask_token_id), input_ids)
    corrupted = torch.where(to_random, replacements, corrupted)
    labels = torch.where(chosen, input_ids, torch.full_like(input_ids, -100))
    return {**batch, "input_ids": corrupted, "labels": labels}


def choose_random(batch: dict[str, torch.Tensor], keys: torch.Tensor, config: MaskingConfig) -> torch.Tensor:
    """BERT: each maskable token independently with probability `budget`."""
    return maskable(batch) & (_uniform(keys, _STREAM_CHOOSE, _positions(batch)) < config.budget)


def choose_tmr(batch: dict[str, torch.Tensor], keys: torch.Tensor, config: MaskingConfig) -> torch.Tensor:
    """TMR: each maskable token independently with probability `tmr_probability`."""
    return maskable(batch) & (_uniform(keys, _STREAM_CHOOSE, _positions(batch)) < config.tmr_probability)


def choose_words(
    batch: dict[str, torch.Tensor], keys: torch.Tensor, budget: torch.Tensor, token_weights: torch.Tensor | None
) -> torch.Tensor:
    """Whole words in the order of an exponential race on their weights (uniform order when
    `token_weights` is None; else each word weighs the sum of its tokens' weights), taken while the
    words chosen before hold fewer than `budget` tokens. Returns the chosen tokens."""
    can_mask = maskable(batch)
    word_ids = batch["word_ids"].to(torch.int64)
    slots = torch.where(can_mask, word_ids, torch.zeros_like(word_ids))  # a word id < length
    length = word_ids.shape[1]
    word_tokens = torch.zeros(word_ids.shape, dtype=torch.int64, device=word_ids.device)
    word_tokens.scatter_add_(1, slots, can_mask.to(torch.int64))
    present = word_tokens > 0
    if token_weights is None:
        word_weight = present.to(torch.float64)
    else:
        # A word whose tokens all have weight 0 is never chosen (its race time is infinite).
        word_weight = torch.zeros(word_ids.shape, dtype=torch.float64, device=word_ids.device)
        word_weight.scatter_add_(1, slots, token_weights.to(torch.float64).masked_fill(~can_mask, 0.0))
    word_counter = torch.arange(length, device=word_ids.device, dtype=torch.int64)[None, :]
    race = -torch.log(_uniform(keys, _STREAM_WORD_RACE, word_counter)) / word_weight  # inf where weight 0
    # Each word holds >= 1 token, so no sequence takes more words than its budget: the first
    # max(budget) words of the race suffice (topk, cheaper than a full sort; the same words
    # whatever the other sequences of the batch).
    first = min(int(budget.max()) if budget.numel() else 0, length)
    race_in_order, order = torch.topk(race, first, dim=1, largest=False, sorted=True)
    tokens_in_order = word_tokens.gather(1, order)
    before = torch.cumsum(tokens_in_order, dim=1) - tokens_in_order
    take_in_order = (before < budget[:, None]) & torch.isfinite(race_in_order)
    chosen_words = torch.zeros(word_ids.shape, dtype=torch.bool, device=word_ids.device).scatter(1, order, take_in_order)
    return can_mask & chosen_words.gather(1, slots)


ORDER_TABLE_ROWS = 1024


@functools.lru_cache(maxsize=64)
def _order_table(length: int, device: torch.device) -> torch.Tensor:
    """ORDER_TABLE_ROWS random permutations of range(length), each written twice in a row (so that
    a rotation is a slice), built once from the hash on the CPU (a stable sort of hash keys, so
    the same table on every device). Flattened, int16 or int32: small enough to stay in cache."""
    table_keys = mix64(torch.arange(ORDER_TABLE_ROWS, dtype=torch.int64) * _GOLDEN + 0x0DE7)
    counters = torch.arange(length, dtype=torch.int64)[None, :]
    order_keys = _shift_right(_hash(table_keys, _STREAM_ORDER, counters), 33)
    table = torch.argsort(order_keys, dim=1, stable=True)
    dtype = torch.int16 if length <= torch.iinfo(torch.int16).max else torch.int32
    return torch.cat([table, table], dim=1).reshape(-1).to(device=device, dtype=dtype)


def random_order(bits: torch.Tensor, input_length: int) -> torch.Tensor:
    """A random permutation of range(input_length) per sample from 32 random bits (a [batch] int64):
    one of ORDER_TABLE_ROWS fixed random permutations (10 bits), rotated by a random offset
    (20 more bits), so 1024 x length orders. A gather instead of a per-row sort, which on a CPU costs
    more than the whole `random` strategy (docs/masking.md)."""
    row = bits & (ORDER_TABLE_ROWS - 1)
    rotation = (_shift_right(bits, 12) & 0xFFFFF) % input_length
    first = row * (2 * input_length) + rotation
    positions = torch.arange(input_length, device=bits.device)
    return torch.take(_order_table(input_length, bits.device), first[:, None] + positions).to(torch.int64)


def difference_weights(batch: dict[str, torch.Tensor], can_mask: torch.Tensor,
                       column: str = "mask_probability") -> torch.Tensor:
    """The maskable tokens' `column` (the stored `mask_probability`, or a peer signal's weight), float64;
    a sequence whose weights are all 0 falls back to uniform weights."""
    weights = batch[column].clamp(min=0.0).to(torch.float64).masked_fill(~can_mask, 0.0)
    total = weights.sum(dim=1, keepdim=True)
    if not bool((total > 0).all()):
        weights = torch.where(total > 0, weights, can_mask.to(torch.float64))
    return weights


def choose_difference(batch: dict[str, torch.Tensor], keys: torch.Tensor, config: MaskingConfig) -> torch.Tensor:
    """Exactly `round(budget x maskable)` tokens per sequence, each included with probability
    proportional to its `mask_probability` (randomized systematic sampling); whole words with
    `config.whole_word`."""
    can_mask = maskable(batch)
    budget = budget_counts(can_mask, config.budget)
    weights = difference_weights(batch, can_mask)
    if config.whole_word:
        return choose_words(batch, keys, budget, weights)
    return choose_weighted(keys, can_mask, budget, weights)


def choose_weighted(keys: torch.Tensor, can_mask: torch.Tensor, budget: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Exactly `budget` tokens per sequence, token i included with probability proportional to
    `weights[i]` (randomized systematic sampling)."""
    inclusion = scale_to_budget(weights, can_mask, budget)  # each at most 1, summing to the budget
    # Random order, then the points start + 0, 1, 2, ... on the cumulative inclusion line: token i
    # is chosen iff a point falls in its interval, which happens with probability inclusion[i]
    # whatever the order (the order only decides which tokens tend to be chosen together).
    bits = _hash(keys, _STREAM_ORDER, torch.zeros((1, 1), dtype=torch.int64, device=keys.device))[:, 0]
    order = random_order(bits & 0xFFFFFFFF, input_length=inclusion.shape[1])
    cumulative = torch.cumsum(inclusion.gather(1, order), dim=1)
    # The start is kept 1e-9 away from 0 and 1 so that float rounding of the cumulative sums
    # (~1e-15) can neither add nor lose a point: exactly `budget` points fall on the line.
    start = _unit(_shift_right(bits, 32), 32).clamp(min=1e-9, max=1.0 - 1e-9)[:, None]
    points_up_to = torch.ceil(cumulative - start)
    chosen_in_order = torch.diff(points_up_to, dim=1, prepend=torch.zeros_like(points_up_to[:, :1])) > 0
    # Tokens with inclusion 0 (specials, padding) have empty intervals: never chosen.
    return torch.zeros_like(chosen_in_order).scatter(1, order, chosen_in_order)


def _peer_column(batch: dict[str, torch.Tensor], name: str) -> torch.Tensor:
    if name not in batch:
        raise ValueError(f"the batch has no {name!r}: the peer-signal strategies need a dataset built with "
                         "`maskstream build --peer-signals`, read with peer_columns=peer_columns(strategy)")
    return batch[name]


def choose_pmi_units(batch: dict[str, torch.Tensor], keys: torch.Tensor, config: MaskingConfig,
                     difference: bool) -> torch.Tensor:
    """PMI-Masking: whole units (`span_ids`: collocations and words) in a uniformly random order, or in
    an exponential race on their summed `mask_probability` with `difference`, to the budget (as
    `whole_word`: the last unit may pass it)."""
    units = {**batch, "word_ids": _peer_column(batch, "span_ids")}
    can_mask = maskable(batch)
    weights = difference_weights(batch, can_mask) if difference else None
    return choose_words(units, keys, budget_counts(can_mask, config.budget), weights)


def choose_informask(batch: dict[str, torch.Tensor], keys: torch.Tensor, config: MaskingConfig) -> torch.Tensor:
    """InforMask: exactly the budget of tokens, each included with probability proportional to its
    word's informativeness weight. Tokens of weight 0 (punctuation, words the word table lacks) are
    drawn only in a sequence whose weighted tokens are fewer than its budget, uniformly, to fill it."""
    _peer_column(batch, "informativeness")
    can_mask = maskable(batch)
    budget = budget_counts(can_mask, config.budget)
    weights = difference_weights(batch, can_mask, "informativeness")
    short = ((weights > 0).sum(dim=1) < budget)[:, None] & can_mask & (weights == 0)
    # Far below every weight (those are >= 1 / word types): water-filling sets the weighted tokens to 1 first.
    weights = torch.where(short, torch.full_like(weights, 1e-12), weights)
    return choose_weighted(keys, can_mask, budget, weights)


def _span_length_thresholds(config: MaskingConfig) -> list[float]:
    """CDF of Geometric(span_p) truncated at span_max, at lengths 1 .. span_max - 1."""
    q = 1.0 - config.span_p
    norm = 1.0 - q**config.span_max
    return [(1.0 - q**m) / norm for m in range(1, config.span_max)]


def choose_spans(
    batch: dict[str, torch.Tensor], keys: torch.Tensor, config: MaskingConfig
) -> tuple[torch.Tensor, torch.Tensor]:
    """SpanBERT spans of whole words up to the budget. Returns (chosen tokens, span id per token)."""
    can_mask = maskable(batch)
    budget = budget_counts(can_mask, config.budget)
    word_ids = torch.where(can_mask, batch["word_ids"].to(torch.int64), torch.full_like(batch["word_ids"], -1, dtype=torch.int64))
    words = word_ids.max(dim=1).values + 1  # word ids are 0, 1, 2, ... within a sequence
    rounds = 2 * budget + 10  # spans tried per sequence: a function of the sequence alone
    max_rounds = int(rounds.max()) if rounds.numel() else 0
    # Every candidate span's start word and length, drawn at once: [batch, round].
    counters = torch.arange(max_rounds, dtype=torch.int64, device=word_ids.device)[None, :]
    starts = torch.floor(_uniform(keys, _STREAM_SPAN_START, counters) * words[:, None]).to(torch.int64)
    u = _uniform(keys, _STREAM_SPAN_LENGTH, counters)
    ends = starts + 1
    for threshold in _span_length_thresholds(config):
        ends += (u >= threshold).to(torch.int64)
    chosen = torch.zeros_like(can_mask)
    span_id = torch.full_like(word_ids, -1)
    counts = torch.zeros_like(budget)
    for round_index in range(max_rounds):
        start, end = starts[:, round_index : round_index + 1], ends[:, round_index : round_index + 1]
        new = (word_ids >= start) & (word_ids < end) & ~chosen
        new_count = new.sum(dim=1)
        accept = (counts + new_count <= budget) & (round_index < rounds) & (new_count > 0)
        new &= accept[:, None]
        chosen |= new
        span_id.masked_fill_(new, round_index)
        counts += torch.where(accept, new_count, 0)
        # Rows that are full cannot change any more; stopping early keeps results identical.
        if round_index % 4 == 3 and bool(((counts >= budget) | (round_index + 1 >= rounds)).all()):
            break
    return chosen, span_id


def mask_random(batch: dict[str, torch.Tensor], keys: torch.Tensor, config: MaskingConfig) -> dict[str, torch.Tensor]:
    return corrupt(batch, choose_random(batch, keys, config), keys, config)


def mask_whole_words(batch: dict[str, torch.Tensor], keys: torch.Tensor, config: MaskingConfig) -> dict[str, torch.Tensor]:
    can_mask = maskable(batch)
    return corrupt(batch, choose_words(batch, keys, budget_counts(can_mask, config.budget), None), keys, config)


def mask_spans(batch: dict[str, torch.Tensor], keys: torch.Tensor, config: MaskingConfig) -> dict[str, torch.Tensor]:
    chosen, span_id = choose_spans(batch, keys, config)
    return corrupt(batch, chosen, keys, config, action_counters=span_id)


def mask_difference(batch: dict[str, torch.Tensor], keys: torch.Tensor, config: MaskingConfig) -> dict[str, torch.Tensor]:
    return corrupt(batch, choose_difference(batch, keys, config), keys, config)


def mask_pmi_units(batch: dict[str, torch.Tensor], keys: torch.Tensor, config: MaskingConfig) -> dict[str, torch.Tensor]:
    return corrupt(batch, choose_pmi_units(batch, keys, config, difference=False), keys, config)


def mask_pmi_units_by_difference(
    batch: dict[str, torch.Tensor], keys: torch.Tensor, config: MaskingConfig
) -> dict[str, torch.Tensor]:
    return corrupt(batch, choose_pmi_units(batch, keys, config, difference=True), keys, config)


def mask_informask(batch: dict[str, torch.Tensor], keys: torch.Tensor, config: MaskingConfig) -> dict[str, torch.Tensor]:
    return corrupt(batch, choose_informask(batch, keys, config), keys, config)


def mask_tmr(batch: dict[str, torch.Tensor], keys: torch.Tensor, config: MaskingConfig) -> dict[str, torch.Tensor]:
    """Every chosen token becomes [MASK] (no 80/10/10)."""
    chosen = choose_tmr(batch, keys, config)
    input_ids = batch["input_ids"]
    masked = torch.where(chosen, torch.full_like(input_ids, config.mask_token_id), input_ids)
    labels = torch.where(chosen, input_ids, torch.full_like(input_ids, -100))
    return {**batch, "input_ids": masked, "labels": labels}


# How each strategy of maskstream.trainer.strategies.STRATEGIES draws, under the same names.
DRAWS: dict[str, Callable[[dict[str, torch.Tensor], torch.Tensor, MaskingConfig], dict[str, torch.Tensor]]] = {
    "random": mask_random,
    "whole_word": mask_whole_words,
    "span": mask_spans,
    "difference": mask_difference,
    "pmi_span": mask_pmi_units,
    "difference_pmi_span": mask_pmi_units_by_difference,
    "informask": mask_informask,
    "tmr": mask_tmr,
}


def apply_masking(
    batch: dict[str, torch.Tensor], strategy: str, config: MaskingConfig, *, seed: int, epoch: int
) -> dict[str, torch.Tensor]:
    """A new batch with `input_ids` masked by `strategy` and `labels` (-100 where not masked).

    `batch` is what `collate_sequences` returns (on any device); its `sample_index` keys the
    randomness, so a sample gets the same mask in any batch, on any rank, worker or device.
    `strategy`: a name of maskstream.trainer.strategies.STRATEGIES; `config`: the budget and the
    token ids (MaskingConfig); `seed` and `epoch`: with the sample index, all the mask depends on (a
    fresh mask each epoch, the same one on a rerun).
    """
    draw = DRAWS[check_strategy(strategy)]
    return draw(batch, sample_keys(batch["sample_index"], seed, epoch), config)


def expected_span_length(config: MaskingConfig) -> float:
    """Mean span length in words of the truncated geometric (3.8 for p = 0.2, max 10)."""
    q = 1.0 - config.span_p
    return sum(m * config.span_p * q ** (m - 1) for m in range(1, config.span_max + 1)) / (
        1.0 - q**config.span_max
    )


__all__ = [
    "DRAWS",
    "STRATEGIES",
    "BudgetSchedule",
    "MaskingConfig",
    "apply_masking",
    "expected_span_length",
]
