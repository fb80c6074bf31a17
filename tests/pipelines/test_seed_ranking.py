"""`maskstream seeds` ranks the stats in batches (`SeedRanking`): checked against ranking every row at once."""

from __future__ import annotations

import random
from collections import Counter

from maskstream.pipelines.statistics.seed_selection import REPORT_CANDIDATES, SeedRanking, filter_reasons

FILTERS = {"min_df": 3, "min_length": 3, "stop_words": frozenset({"the", "and", "data"}), "alphabetic_only": True}


def made_rows(n: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    words = {"the", "and", "data", "x1", "ab"} | {
        "".join(rng.choice("abcdefghij0") for _ in range(rng.randint(2, 7))) for _ in range(n)}
    # Few distinct scores, so that ties (broken by the word) are common.
    return [{"word": w, "tf": rng.randint(1, 50), "df": rng.randint(1, 9), "tf_icf": rng.randint(0, 40) / 8,
             "contrast": rng.randint(0, 40) / 4} for w in sorted(words)]


def test_batched_ranking_equals_sorting_every_row():
    rows = made_rows(5000)
    shuffled = rows[:]
    random.Random(1).shuffle(shuffled)
    ranking = SeedRanking(20, "contrast", **FILTERS)
    for start in range(0, len(shuffled), 97):
        ranking.add(shuffled[start:start + 97])

    def best(score):
        return sorted(rows, key=lambda r: (-r[score], r["word"]))

    judged = [(row, filter_reasons(row, **FILTERS)) for row in best("contrast")]
    kept_by_tf_icf = [row for row in best("tf_icf") if not filter_reasons(row, **FILTERS)]
    assert ranking.seeds == [row for row, reasons in judged if not reasons][:20]
    assert ranking.candidates == judged[:REPORT_CANDIDATES]
    assert ranking.by_tf_icf == kept_by_tf_icf[:20]
    assert ranking.removed == Counter(reason for _, reasons in judged for reason in reasons)
    assert ranking.words == len(rows)
    position = {row["word"]: rank for rank, row in enumerate(kept_by_tf_icf, start=1)}
    batches = [shuffled[start:start + 500] for start in range(0, len(shuffled), 500)]
    assert ranking.tf_icf_ranks(batches) == {row["word"]: position[row["word"]] for row in ranking.seeds}
