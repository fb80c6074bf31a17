#!/usr/bin/env bash
# The whole job on the shipped sample (`make demo`): corpus statistics, seed words, the
# dataset (build) and its inspection, a short training run, then fine-tuning on the sections.
set -euo pipefail
cd "$(dirname "$0")/.."

OUT="${OUT:-out/demo}"
MASKSTREAM="${MASKSTREAM:-maskstream}"
CORPUS="${CORPUS:-data/debian-science.jsonl}"
# MODEL: one model for build's word encoder and tokenizer and for train (default: each command's own:
# build scores words with the offline all-MiniLM-L6-v2, train starts from the general-English masked LM
# shipped with maskstream, which reads the same vocabulary).
MODEL_ARGS=(${MODEL:+--model "$MODEL"})

echo "== maskstream stats: word counts and TF-ICF of $CORPUS"
$MASKSTREAM stats --input "$CORPUS" --output "$OUT/stats"

echo "== maskstream seeds: top 20 words by TF-ICF after filters"
$MASKSTREAM seeds --stats "$OUT/stats" --output "$OUT/seeds.json"

echo "== maskstream build: tokens, word similarities to the seeds, mask probabilities -> $OUT/dataset"
$MASKSTREAM build --input "$CORPUS" --stats "$OUT/stats" --seeds "$OUT/seeds.json" --output "$OUT/dataset" \
  "${MODEL_ARGS[@]}"

echo "== maskstream inspect: summary, shard checksums, marked sample sequences, histograms, an HTML page (the signal: above)"
$MASKSTREAM inspect "$OUT/dataset" --plot "$OUT/mask_probabilities.png" --html "$OUT/report.html"

echo "== maskstream export-map: the version's mask map, to mask any text at load time (MaskMap) -> $OUT/mask_map"
$MASKSTREAM export-map "$OUT/dataset" --output "$OUT/mask_map"

echo "== maskstream train: 30 steps of continued MLM pretraining on CPU, difference masking -> $OUT/train"
$MASKSTREAM train --dataset "$OUT/dataset" --output "$OUT/train" --strategy difference "${MODEL_ARGS[@]}" \
  --batch-size 8 --max-steps 30 --warmup-ratio 0.1 --learning-rate 5e-4 --num-workers 1 \
  --log-every 5 --eval-every 15 --save-every 15 --eval-samples 64

echo "== maskstream finetune: Debian section (science/math/electronics) from the trained model, TMR p=0.1, class weights"
$MASKSTREAM finetune --train "$CORPUS" --text-column text --label-column section --split-key package \
  --validation-fraction 0.1 --model "$OUT/train/model" --output "$OUT/finetune" --class-weights \
  --epochs 1 --max-steps 60 --batch-size 16 --max-length 64 --learning-rate 1e-4

echo
echo "What to look at:"
echo "  - $OUT/report.html (open it in a browser): every token coloured by its mask probability; hover for its word and seed"
echo "  - the masking signal (build, above): seed words should get several times their share of the masks"
echo "    (lift > 1) and stop words less (lift < 1); a near-uniform WARNING names the knob to turn"
echo "  - the marked sequences (inspect, above): [[tokens]] are the ones most likely masked"
echo "  - $OUT/mask_probabilities.png and $OUT/mask_probabilities_signal.png: the probabilities, and which words get the masks"
echo "  - $OUT/seeds_report.md: why these seed words"
echo "  - $OUT/mask_map/: the signal as a table any training loop can apply (docs/training.md, 'Difference masking in your own loop')"
echo "  - held-out loss and masked-token accuracy before and after training: the train log above, $OUT/train/metrics.jsonl"
echo "  - $OUT/finetune/evaluation.json and $OUT/finetune/confusion-validation.png: the classifier on the Debian sections"
echo "Everything is under $OUT: the dataset in $OUT/dataset/$(cat "$OUT/dataset/latest")/, the model in $OUT/train/model/."
