"""Per-token mask probabilities (`maskstream.schemas.formulas`: `difference-masking-v1`), vectorized.

For one sequence with non-special tokens T (n = |T|):

1. Each token's weight comes from its *word*: every subword token of a word gets the word's
   weight (the word is scored once, not per token). Tokens outside any known word
   (punctuation, words missing from the word table; `word_index == -1`) weigh 0.
   - `similarity`: w = max(similarity of the word to its nearest seed, 0) ** sharpness
     (`sharpen`). sharpness = 1 is the paper's map; a larger power widens the gap between the
     words near a seed and the rest (cosines of a sentence encoder sit close together, about
     0.2 +- 0.1 for most words, so the paper's map is close to uniform).
   - `rank` (the reference code): the N word occurrences of the sequence with a known word are
     ranked by similarity, highest first (ties by position); the r-th (r = 1..N) weighs N - r.
2. p_sim = w / sum(w) over T (uniform over T when every weight is 0).
3. q = alpha * p_sim + (1 - alpha) / n: mixed with uniform, so with alpha < 1 every non-special
   token (punctuation included) keeps a chance of (1 - alpha) / n of the mass.
4. p = min(1, c * q) with c chosen so that sum(p) = budget * n: tokens whose scaled weight
   exceeds 1 are clipped to 1 and the rest of the budget is redistributed over the others in
   proportion to q, repeated until nothing exceeds 1 (water-filling). When fewer than
   budget * n tokens have q > 0 (alpha = 1 and few scored words), those tokens get 1 and the sum
   falls short of the budget: nothing else can be masked.
5. The floor (`floor` = f, 0 by default, the paper's map): every non-special token gets at least
   f, and the rest of the budget follows the map: p = f + (1 - f) * p', with p' from step 4 for
   the budget (budget - f) / (1 - f). sum(p) = f * n + (budget - f) * n = budget * n stays exact,
   p stays in [f, 1] and in the order of q. So no token is unmaskable, however sharp the weights.
   A sequence whose p' falls short (step 4: too few tokens with q > 0, e.g. code where most
   tokens are outside words) gets the floor f_s = (budget * n - S') / (n - S') > f instead,
   S' = sum(p'), so its sum is the budget too: any f > 0 closes the gap the paper's map leaves.
   (alpha < 1 also keeps every token above (1 - alpha) * budget, but it spreads that mass
   uniformly *in proportion to q*: once a sharp map clips the seeds to 1, the budget left over
   goes almost uniformly to every other token, stop words included. The floor does not.)
6. Special tokens get 0.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np

WEIGHTINGS = ("similarity", "rank")
PAPER_SHARPNESS = 1.0
# The documented sharpened setting (docs/signal.md): on the shipped corpus with background-contrast
# seeds it gives a seed-word lift of 6.5 and a stop-word lift of 0.23, and no token below p = 0.01.
SHARPENED = {"weighting": "similarity", "sharpness": 8.0, "alpha": 1.0, "floor": 0.01}


def check_budget(budget: float, flag: str = "--budget") -> None:
    """The one rule for a masking budget, the share of a sequence's maskable tokens to mask: (0, 1]."""
    if not 0.0 < budget <= 1.0:
        raise ValueError(f"{flag} must be in (0, 1], got {budget}")


@dataclasses.dataclass(frozen=True)
class MaskSettings:
    """What turns the words' similarities into per-token mask probabilities: the build's options of
    these names (`BuildConfig` takes its defaults from here), written flat into the manifest's config
    and read back by `MaskMap`, the trainer's text sources and `inspect`'s comparison maps.

    budget: the share of a sequence's non-special tokens masked (its p sums to budget x n).
    alpha: the share of the map in its mix with uniform weights (1: the map alone).
    weighting: `similarity` (the paper's weights) or `rank` (the reference code's N - r).
    sharpness: the power on the similarities (1: the paper's map). floor: every non-special token's
    least probability. max_length: the width rows are padded to while computing, so that a row's
    probabilities do not depend on the rows beside it (the build's --max-length).
    """

    budget: float = 0.15
    alpha: float = 1.0
    weighting: str = "similarity"
    sharpness: float = PAPER_SHARPNESS
    floor: float = 0.0
    max_length: int = 128

    def __post_init__(self) -> None:
        """Each setting's range, checked here once: the build's options (`BuildConfig`), a manifest's
        config and a MaskMap all make one of these. `max_length` 0 pads to each batch's longest row."""
        check_budget(self.budget)
        checks = [("--alpha", self.alpha, "in [0, 1]", 0.0 <= self.alpha <= 1.0),
                  ("--weighting", self.weighting, f"one of {WEIGHTINGS}", self.weighting in WEIGHTINGS),
                  ("--sharpness", self.sharpness, "> 0", self.sharpness > 0),
                  ("--floor", self.floor, f"in [0, --budget = {self.budget}]", 0.0 <= self.floor <= self.budget)]
        for flag, value, rule, ok in checks:
            if not ok:
                raise ValueError(f"{flag} must be {rule}, got {value}")

    @classmethod
    def of(cls, config: Mapping[str, Any]) -> MaskSettings:
        """From a manifest's config (or any mapping holding these names; other keys are ignored). A name
        left out, by a manifest written before its option existed, takes the value it meant then: the
        default here."""
        return cls(**{field.name: config[field.name] for field in dataclasses.fields(cls) if field.name in config})

    def options(self) -> dict[str, Any]:
        """`mask_probabilities_flat`'s keyword arguments."""
        return {"budget": self.budget, "alpha": self.alpha, "weighting": self.weighting,
                "sharpness": self.sharpness, "floor": self.floor, "width": self.max_length}


def sharpen(similarity: np.ndarray, sharpness: float) -> np.ndarray:
    """Weight of a word from its similarity: max(similarity, 0) ** sharpness, non-decreasing in
    the similarity. sharpness = 1 returns max(similarity, 0) itself (the paper's map, bit for bit)."""
    if sharpness <= 0:
        raise ValueError(f"sharpness must be > 0, got {sharpness}")
    weight = np.maximum(similarity, 0.0)
    return weight if sharpness == PAPER_SHARPNESS else weight**sharpness


def _padded(values: np.ndarray, offsets: np.ndarray, fill, dtype, width: int) -> np.ndarray:
    """Flat ragged rows -> a [rows, max(width, longest row)] array, vectorized."""
    lengths = np.diff(offsets)
    out = np.full((len(lengths), max(width, int(lengths.max(initial=0)))), fill, dtype=dtype)
    rows = np.repeat(np.arange(len(lengths)), lengths)
    out[rows, np.arange(len(values)) - np.repeat(offsets[:-1], lengths)] = values
    return out


def token_weights(
    word_similarity: np.ndarray,  # [B, L] similarity of each token's word (0 where unknown)
    word_ids: np.ndarray,  # [B, L] occurrence index within the sequence, -1 for specials/padding
    known: np.ndarray,  # [B, L] bool: the token belongs to a word of the word table
    weighting: str,
    sharpness: float = PAPER_SHARPNESS,
) -> np.ndarray:
    """Un-normalized weight of every token, from its word (see the module docstring).
    `sharpness` applies to `similarity` weights; ranks do not change under it."""
    if weighting == "similarity":
        return np.where(known, sharpen(word_similarity, sharpness), 0.0)
    if weighting != "rank":
        raise ValueError(f"unknown weighting {weighting!r}; choose from {WEIGHTINGS}")
    batch, length = word_ids.shape
    # One score per word occurrence: the first token of each occurrence stands for it.
    first = known.copy()
    first[:, 1:] &= word_ids[:, 1:] != word_ids[:, :-1]
    score = np.where(first, word_similarity, -np.inf)
    positions = np.broadcast_to(np.arange(length), (batch, length))
    # Sort by similarity descending, ties by position (lexsort: last key is primary).
    order = np.lexsort((positions, -score), axis=-1)
    rank = np.empty_like(order)
    np.put_along_axis(rank, order, np.broadcast_to(np.arange(1, length + 1), (batch, length)), axis=-1)
    occurrences = first.sum(axis=1, keepdims=True)
    occurrence_weight = np.where(first, occurrences - rank, 0).astype(np.float64)
    # Spread each occurrence's weight to all of its tokens: index by occurrence id.
    max_occ = int(word_ids.max(initial=-1)) + 1
    by_occurrence = np.zeros((batch, max_occ + 1))
    rows = np.broadcast_to(np.arange(batch)[:, None], (batch, length))
    occ = np.where(word_ids >= 0, word_ids, max_occ)
    np.add.at(by_occurrence, (rows[first], occ[first]), occurrence_weight[first])
    return np.where(known, by_occurrence[rows, occ], 0.0)


def scale_to_budget(q: Any, valid: Any, target: Any) -> Any:
    """p = min(1, c * q) per row, c chosen so that each row's p sums to its `target` (the build: the
    budget times the row's valid tokens; the trainer: its count of tokens to mask), the excess over 1
    given to the row's other tokens in proportion to q, until nothing exceeds 1 (water-filling). A row
    whose tokens with q > 0 are too few to reach the target gets 1 for each of them.

    `q` ([rows, length], >= 0), `valid` (bool, same shape) and `target` ([rows]) are numpy arrays or
    torch tensors, on any device: the same operations on either, so the build's stored probabilities
    and the trainer's inclusion probabilities come from one rule (equal within float rounding,
    tests/test_mask_signal.py)."""
    where = np.where if isinstance(q, np.ndarray) else _torch_where()
    clipped = valid & False
    for _ in range(q.shape[1] + 1):
        free = valid & ~clipped & (q > 0)
        remaining = target - clipped.sum(axis=1)
        free_mass = where(free, q, 0.0).sum(axis=1)
        scale = where(free_mass > 0, remaining / where(free_mass > 0, free_mass, 1.0), 0.0)
        p = where(clipped, 1.0, where(free, q * scale[:, None], 0.0))
        over = free & (p > 1.0)
        if not over.any():
            break
        clipped |= over
    return where(p > 1.0, 1.0, p)


def _torch_where() -> Any:
    import torch  # only for tensors: the signal layer imports no torch of its own

    return torch.where


def mask_probabilities_flat(
    word_ids: np.ndarray,
    word_index: np.ndarray,
    special_tokens_mask: np.ndarray,
    offsets: np.ndarray,
    similarity: np.ndarray,
    *,
    budget: float = 0.15,
    alpha: float = 1.0,
    weighting: str = "similarity",
    sharpness: float = PAPER_SHARPNESS,
    floor: float = 0.0,
    width: int = 0,
) -> np.ndarray:
    """float32 mask probability per token for a batch of sequences, flat: sequence i is
    `[offsets[i], offsets[i + 1])` of the three flat arrays and of the result.

    `similarity[k]` is word-table row k's similarity; `word_index` -1 means no known word.
    Rows are padded to at least `width`: with a fixed width (the maximum sequence length) each
    sequence's result is bit-identical whatever other sequences share its batch.
    """
    check_budget(budget, "budget")
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    if not 0.0 <= floor <= budget:
        raise ValueError(f"floor must be in [0, budget = {budget}], got {floor}")
    ids = _padded(word_ids, offsets, -1, np.int64, width)
    index = _padded(word_index, offsets, -1, np.int64, width)
    valid = _padded(special_tokens_mask, offsets, 1, np.int8, width) == 0
    known = valid & (index >= 0)
    word_similarity = np.where(known, similarity[np.maximum(index, 0)] if len(similarity) else 0.0, 0.0)

    weights = token_weights(word_similarity, ids, known, weighting, sharpness)
    total = weights.sum(axis=1, keepdims=True)
    count = valid.sum(axis=1, keepdims=True)
    uniform = np.where(valid, 1.0 / np.maximum(count, 1), 0.0)
    p_sim = np.where(total > 0, weights / np.where(total > 0, total, 1.0), uniform)
    q = alpha * p_sim + (1.0 - alpha) * uniform
    if floor == 0.0:
        p = scale_to_budget(q, valid, budget * valid.sum(axis=1))
    else:
        share = (budget - floor) / (1.0 - floor)
        mapped = scale_to_budget(q, valid, share * valid.sum(axis=1))
        # A sequence with fewer than share * n tokens of q > 0 cannot reach its share (step 4): its
        # floor is raised to (budget * n - S) / (n - S), S = sum(mapped), so the sum is still the budget.
        n, reached = valid.sum(axis=1), mapped.sum(axis=1)
        short = reached < share * n * (1.0 - 1e-9)
        raised = np.divide(budget * n - reached, n - reached, out=np.full(len(n), floor), where=short & (n > reached))
        row_floor = np.where(short, raised, floor)[:, None]
        p = np.where(valid, row_floor + (1.0 - row_floor) * mapped, 0.0)
    p = p.astype(np.float32)
    lengths = np.diff(offsets)
    return p[np.arange(p.shape[1])[None, :] < lengths[:, None]]  # row-major: back to flat order
