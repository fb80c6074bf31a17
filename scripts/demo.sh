#!/usr/bin/env bash
# The whole job on the shipped sample (`make demo`): corpus statistics, seed words, then the
# dataset (build) and its inspection.
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

echo "== maskstream build: tokens, word similarities to the seeds, mask probabilities -> $OUT/dataset"
$MASKSTREAM build --input "$CORPUS" --stats "$OUT/stats" --seeds "$OUT/seeds.json" --output "$OUT/dataset"

echo "== maskstream inspect: summary, shard checksums, marked sample sequences, histogram"
$MASKSTREAM inspect "$OUT/dataset" --plot "$OUT/mask_probabilities.png"

echo
echo "Outputs:"
echo "  word statistics  $OUT/stats/word_stats-*.parquet"
echo "  summary          $OUT/stats/summary.json"
echo "  rejects          $OUT/stats/rejects-*.jsonl"
echo "  seeds            $OUT/seeds.json"
echo "  seed report      $OUT/seeds_report.md (chart: $OUT/seeds.png)"
echo "  dataset          $OUT/dataset/$(cat "$OUT/dataset/latest")/ (the newest complete version, named in $OUT/dataset/latest)"
echo "  histogram        $OUT/mask_probabilities.png"
echo
echo "Inspect the dataset again with:  maskstream inspect $OUT/dataset"
