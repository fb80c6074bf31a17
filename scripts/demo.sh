#!/usr/bin/env bash
# The whole job on the shipped sample (`make demo`).
# Later stages append their steps below. OUT: where everything goes (default out/demo).
set -euo pipefail
cd "$(dirname "$0")/.."

OUT="${OUT:-out/demo}"
MASKSTREAM="${MASKSTREAM:-maskstream}"
CORPUS="data/debian-science.jsonl"

# --- train and finetune (issue 5): expects the dataset `maskstream build` wrote to $OUT/dataset ---
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
