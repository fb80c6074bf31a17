"""TF-ICF per word: frequent in the domain corpus, rare in general text.

    tf_icf(w) = (tf_D(w) / sum_v tf_D(v)) * log(1 / max(f_G(w), floor))

`f_G(w)` is the word's relative frequency in general text: from the `wordfreq` tables
(`word_frequency(w, language)`, offline), or from a second corpus counted by the same
transforms (`tf_G(w) / sum_v tf_G(v)`). A word general text lacks has `f_G = 0`, and would
get an infinite score; it is scored as if it occurred `unseen_count` times (default 0.5) at
the general source's resolution instead:

- wordfreq: `floor = unseen_count * 1e-8` (its English list stops at 1e-8, so an unseen word
  is taken to be half as frequent as the rarest listed one: `floor = 5e-9`);
- a general corpus of `T` words: `floor = unseen_count / T` (half an occurrence).

`general_frequency` is stored unfloored (0 for unseen words), so readers can tell them apart.

With a background corpus (`BackgroundContrast`, counted by the same transforms), each word also
gets its background frequency `f_B(w) = tf_B(w) / T_B` (stored unfloored) and

    contrast(w) = tf_icf(w) * max(0, log(p_D(w) / max(f_B(w), unseen_count / T_B)))

with `p_D(w) = tf_D(w) / sum_v tf_D(v)`: TF-ICF times the word's log-lift over the background,
0 for words the domain uses no more than its background does.

The formulas only; `maskstream stats` applies them in `maskstream.pipelines.statistics.stats_transforms`
(`TfIcf`, `BackgroundContrast`), `maskstream update` in its own process.
"""

from __future__ import annotations

import math
from typing import Any

from maskstream.schemas.formulas import TF_ICF_UNSEEN_COUNT as DEFAULT_UNSEEN_COUNT
from maskstream.schemas.formulas import WORDFREQ_RESOLUTION


def tf_icf(tf: int, total_words: int, general_frequency: float, floor: float) -> float:
    """The score of a word with `tf` occurrences among `total_words`; see the module docstring."""
    return (tf / total_words) * math.log(1.0 / max(general_frequency, floor))


def wordfreq_floor(unseen_count: float = DEFAULT_UNSEEN_COUNT) -> float:
    return unseen_count * WORDFREQ_RESOLUTION


def corpus_floor(general_total_words: int, unseen_count: float = DEFAULT_UNSEEN_COUNT) -> float:
    # max(..., 1): an empty general corpus is reported by the caller, not as a division by zero here.
    return unseen_count / max(general_total_words, 1)


def word_stats_row(
    element: tuple[str, tuple[int, int], float], total_words: int, floor: float
) -> dict[str, Any]:
    """A row of maskstream.schemas.tables.WORD_STATS_SCHEMA."""
    word, (tf, df), general_frequency = element
    return {
        "word": word,
        "tf": tf,
        "df": df,
        "general_frequency": general_frequency,
        "tf_icf": tf_icf(tf, total_words, general_frequency, floor),
    }


def background_contrast(tf_icf_score: float, domain_frequency: float, background_frequency: float,
                        floor: float) -> float:
    """TF-ICF times the log-lift of the domain over the background (see the module docstring)."""
    return tf_icf_score * max(0.0, math.log(domain_frequency / max(background_frequency, floor)))
