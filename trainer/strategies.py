"""The masking strategies, by name, and what each is for (maskstream.trainer.masking draws them). No
torch at import: the command line offers them in `--help`."""

from __future__ import annotations

STRATEGIES = {
    "random": "BERT: the budget's tokens chosen uniformly, 80/10/10 [MASK]/random/unchanged, specials never",
    "whole_word": "random masking of whole words: every token of a chosen word",
    "span": "SpanBERT: spans of geometric length (p 0.2, at most 10 words) up to the budget",
    "difference": "Difference-Masking: exactly the budget, drawn by the dataset's stored mask probabilities",
    "pmi_span": "PMI-Masking: whole collocations (the version's --peer-signals vocabulary) and words, random order, to the budget",
    "difference_pmi_span": "PMI-Masking's units, chosen by their summed difference-masking probability, to the budget",
    "informask": "InforMask: exactly the budget, drawn by each word's informativeness weight (--peer-signals)",
    "tmr": "Token Masking Regularization, for fine-tuning only: each token [MASK] with probability p, no 80/10/10",
}
# The strategies that read the version's peer signals (`maskstream build --peer-signals`), and the column
# of them each reads (maskstream.mask_signal.peer_signals: the loader joins only the columns asked for).
PEER_SIGNAL_STRATEGIES = {"pmi_span": "span_ids", "difference_pmi_span": "span_ids", "informask": "informativeness"}
PRETRAINING_STRATEGIES = tuple(name for name in STRATEGIES if name != "tmr")  # what `train` offers


def peer_columns(*strategies: str) -> tuple[str, ...]:
    """The peer-signal columns the loader must join for `strategies` (none for the others)."""
    return tuple(sorted({PEER_SIGNAL_STRATEGIES[s] for s in strategies if s in PEER_SIGNAL_STRATEGIES}))
