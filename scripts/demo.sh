#!/usr/bin/env bash
# The whole job on the shipped sample (`make demo`): corpus statistics, then seed words.
# Later stages append their steps below. OUT: where everything goes (default out/demo).
set -euo pipefail
cd "$(dirname "$0")/.."

OUT="${OUT:-out/demo}"
MASKSTREAM="${MASKSTREAM:-maskstream}"
CORPUS="data/debian-science.jsonl"

echo "== maskstream stats: word counts and TF-ICF of $CORPUS"
$MASKSTREAM stats --input "$CORPUS" --output "$OUT/stats"

echo "== maskstream seeds: top 20 words by TF-ICF after filters"
$MASKSTREAM seeds --stats "$OUT/stats" --output "$OUT/seeds.json"

echo
echo "Outputs:"
echo "  word statistics  $OUT/stats/word_stats-*.parquet"
echo "  summary          $OUT/stats/summary.json"
echo "  rejects          $OUT/stats/rejects-*.jsonl"
echo "  seeds            $OUT/seeds.json"
echo "  seed report      $OUT/seeds_report.md (chart: $OUT/seeds.png)"
