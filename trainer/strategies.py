"""The masking strategies, by name: what each is for, the peer-signal column it reads, and whether
`maskstream train` offers it. `maskstream.trainer.masking.DRAWS` holds how each draws, under the same
names. No torch at import: the command line offers them in `--help`."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Strategy:
    purpose: str
    # The version's peer-signal column it reads (`maskstream build --peer-signals`; the loader joins only
    # the columns asked for), or None.
    peer_column: str | None = None
    pretraining: bool = True  # offered by `maskstream train`


STRATEGIES = {
    "random": Strategy("BERT: the budget's tokens chosen uniformly, 80/10/10 [MASK]/random/unchanged, specials never"),
    "whole_word": Strategy("random masking of whole words: every token of a chosen word"),
    "span": Strategy("SpanBERT: spans of geometric length (p 0.2, at most 10 words) up to the budget"),
    "difference": Strategy("Difference-Masking: exactly the budget, drawn by the dataset's stored mask probabilities"),
    "pmi_span": Strategy("PMI-Masking: whole collocations (the version's --peer-signals vocabulary) and words, random "
                         "order, to the budget", peer_column="span_ids"),
    "difference_pmi_span": Strategy("PMI-Masking's units, chosen by their summed difference-masking probability, to "
                                    "the budget", peer_column="span_ids"),
    "informask": Strategy("InforMask: exactly the budget, drawn by each word's informativeness weight "
                          "(--peer-signals)", peer_column="informativeness"),
    "tmr": Strategy("Token Masking Regularization, for fine-tuning only: each token [MASK] with probability p, no "
                    "80/10/10", pretraining=False),
}
PEER_SIGNAL_STRATEGIES = {name: s.peer_column for name, s in STRATEGIES.items() if s.peer_column}
PRETRAINING_STRATEGIES = tuple(name for name, s in STRATEGIES.items() if s.pretraining)  # what `train` offers


def check_strategy(name: str, offered: tuple[str, ...] = tuple(STRATEGIES), flag: str = "masking strategy") -> str:
    """`name`, or a ValueError naming what is offered."""
    if name not in offered:
        raise ValueError(f"unknown {flag} {name!r}; choose one of {offered}")
    return name


def peer_columns(*strategies: str) -> tuple[str, ...]:
    """The peer-signal columns the loader must join for `strategies` (none for the others)."""
    return tuple(sorted({PEER_SIGNAL_STRATEGIES[s] for s in strategies if s in PEER_SIGNAL_STRATEGIES}))
