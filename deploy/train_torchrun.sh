#!/usr/bin/env bash
# Multi-GPU continued pretraining with torchrun, the dataset streamed from a bucket.
#
# One machine, every GPU:
#   DATASET=gs://my-bucket/datasets/domain OUTPUT=/mnt/runs/domain-mlm deploy/train_torchrun.sh
# Several machines (run the same command on each, NODE_RANK 0..NNODES-1):
#   NNODES=2 NODE_RANK=0 MASTER_ADDR=10.0.0.2 DATASET=... OUTPUT=... deploy/train_torchrun.sh
# Extra arguments go to `maskstream train` (e.g. --strategy random --epochs 3 --resume).
#
# Each rank streams its own share of the dataset's rows (trainer/dataset.py: rank r of W reads
# stream positions [r n, (r+1) n), n = ceil(rows / W)), so no rank downloads the whole dataset
# and masks do not depend on the number of GPUs. gs:// is read with gcsfs: credentials come from
# GOOGLE_APPLICATION_CREDENTIALS or the machine's service account. OUTPUT is a local (or
# shared, for several nodes) folder: checkpoints, metrics, the final model. When OUTPUT already
# holds a checkpoint (a restarted pod, a rerun after an interruption), the run continues exactly
# from the newest one (`--resume`).
set -euo pipefail

require() {  # require NAME DESCRIPTION
  if [[ -z "${!1:-}" ]]; then
    echo "error: set $1 ($2)" >&2
    exit 2
  fi
}
require DATASET "the dataset root (its 'latest' version is read) or a version folder, e.g. gs://bucket/datasets/domain"
require OUTPUT "the run's folder: checkpoints, metrics.jsonl, tensorboard/, model/"

NNODES="${NNODES:-1}"
NODE_RANK="${NODE_RANK:-0}"
# GPUs per machine (torchrun starts one process per GPU).
NPROC_PER_NODE="${NPROC_PER_NODE:-$(nvidia-smi --list-gpus 2>/dev/null | wc -l)}"
if [[ "$NPROC_PER_NODE" -lt 1 ]]; then
  echo "error: no GPU found; set NPROC_PER_NODE" >&2
  exit 2
fi
MASTER_ADDR="${MASTER_ADDR:-127.0.0.1}"
MASTER_PORT="${MASTER_PORT:-29500}"
# MODEL: the masked LM to train (default: `maskstream train`'s, the general-English model shipped in the
# package); its tokenizer must be the one the dataset was built with.
MODEL_ARGS=(${MODEL:+--model "$MODEL"})
BATCH_SIZE="${BATCH_SIZE:-64}"      # per GPU; the global batch is BATCH_SIZE x GPUs x --grad-accumulation
NUM_WORKERS="${NUM_WORKERS:-4}"     # loader processes per GPU: they read, shuffle and collate

resume=()
if [[ -f "$OUTPUT/checkpoints/latest" ]]; then
  resume=(--resume)
fi

# --nnodes / --node_rank / --nproc_per_node  the world: NNODES x NPROC_PER_NODE ranks.
# --rdzv_backend=c10d --rdzv_endpoint  rendezvous at node 0 (MASTER_ADDR:MASTER_PORT);
#                    --rdzv_id names the job so that two runs on the same nodes do not meet.
# -m maskstream train  torchrun sets RANK, LOCAL_RANK and WORLD_SIZE; `maskstream train` starts
#                    NCCL from them, pins its GPU to LOCAL_RANK, and wraps the model in DDP.
# On CUDA the trainer draws masks on the GPU after the copy; loader workers read and collate.
exec torchrun \
  --nnodes="$NNODES" \
  --node_rank="$NODE_RANK" \
  --nproc_per_node="$NPROC_PER_NODE" \
  --rdzv_backend=c10d \
  --rdzv_endpoint="$MASTER_ADDR:$MASTER_PORT" \
  --rdzv_id="${RDZV_ID:-maskstream-train}" \
  -m maskstream train \
  --dataset "$DATASET" \
  --output "$OUTPUT" \
  "${MODEL_ARGS[@]}" \
  --batch-size "$BATCH_SIZE" \
  --num-workers "$NUM_WORKERS" \
  "${resume[@]}" \
  "$@"
