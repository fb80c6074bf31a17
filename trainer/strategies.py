"""The masking strategies, by name, and what each is for (maskstream.trainer.masking draws them). No
torch at import: the command line offers them in `--help`."""

from __future__ import annotations

STRATEGIES = {
    "random": "BERT: the budget's tokens chosen uniformly, 80/10/10 [MASK]/random/unchanged, specials never",
    "whole_word": "random masking of whole words: every token of a chosen word",
    "span": "SpanBERT: spans of geometric length (p 0.2, at most 10 words) up to the budget",
    "difference": "Difference-Masking: exactly the budget, drawn by the dataset's stored mask probabilities",
    "tmr": "Token Masking Regularization, for fine-tuning only: each token [MASK] with probability p, no 80/10/10",
}
PRETRAINING_STRATEGIES = tuple(name for name in STRATEGIES if name != "tmr")  # what `train` offers
