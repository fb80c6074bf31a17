#!/usr/bin/env bash
# The whole job on the shipped sample (`make demo`): corpus statistics, seed words, the
# dataset (build) and its inspection, a short training run, then fine-tuning on the sections.
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

echo "== maskstream inspect: summary, shard checksums, marked sample sequences, histogram, an HTML page"
$MASKSTREAM inspect "$OUT/dataset" --plot "$OUT/mask_probabilities.png" --html "$OUT/report.html"

echo
echo "Outputs:"
echo "  word statistics  $OUT/stats/word_stats-*.parquet"
echo "  summary          $OUT/stats/summary.json"
echo "  rejects          $OUT/stats/rejects-*.jsonl"
echo "  seeds            $OUT/seeds.json"
echo "  seed report      $OUT/seeds_report.md (chart: $OUT/seeds.png)"
echo "  dataset          $OUT/dataset/$(cat "$OUT/dataset/latest")/ (the newest complete version, named in $OUT/dataset/latest)"
echo "  histogram        $OUT/mask_probabilities.png"
echo "  page             $OUT/report.html (open it in a browser: sequences coloured by mask probability)"
echo
echo "Inspect the dataset again with:  maskstream inspect $OUT/dataset"
echo

echo "== maskstream train: 30 steps of continued MLM pretraining on CPU, difference masking -> $OUT/train"
$MASKSTREAM train --dataset "$OUT/dataset" --output "$OUT/train" --strategy difference \
  --batch-size 8 --max-steps 30 --warmup-ratio 0.1 --learning-rate 5e-4 --num-workers 1 \
  --log-every 5 --eval-every 15 --save-every 15 --eval-samples 64

echo "== maskstream finetune: Debian section (science/math/electronics) from the trained model, TMR p=0.1, class weights"
$MASKSTREAM finetune --train "$CORPUS" --text-column text --label-column section --split-key package \
  --validation-fraction 0.1 --model "$OUT/train/model" --output "$OUT/finetune" --class-weights \
  --epochs 1 --max-steps 60 --batch-size 16 --max-length 64 --learning-rate 1e-4

echo
echo "Training outputs:"
echo "  pretrained model  $OUT/train/model/ (save_pretrained + tokenizer)"
echo "  checkpoints       $OUT/train/checkpoints/ (resume with: maskstream train ... --resume)"
echo "  metrics           $OUT/train/metrics.jsonl, $OUT/train/summary.json (TensorBoard: $OUT/train/tensorboard)"
echo "  classifier        $OUT/finetune/model/, $OUT/finetune/evaluation.json, $OUT/finetune/confusion-validation.png"
