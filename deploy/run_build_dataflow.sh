#!/usr/bin/env bash
# Runs `maskstream build` on Google Cloud Dataflow, its workers in the `dataflow-worker` image.
#
#   GCP_PROJECT=my-project GCP_REGION=europe-west1 GCS_BUCKET=gs://my-bucket \
#   WORKER_IMAGE=europe-west1-docker.pkg.dev/my-project/maskstream/worker:0.1.0 \
#   INPUT='gs://my-bucket/corpus/*.jsonl' STATS=gs://my-bucket/stats \
#   SEEDS=gs://my-bucket/seeds/seeds.json OUTPUT=gs://my-bucket/datasets/domain \
#   deploy/run_build_dataflow.sh [more maskstream build or Beam flags...]
#
# Before: build and push the worker image (its Beam equals the launcher's, 2.77.0):
#   docker build --target dataflow-worker -t "$WORKER_IMAGE" . && docker push "$WORKER_IMAGE"
# and run `maskstream stats` (deploy/run_stats_dataflow.sh) and `maskstream seeds`.
# Needs, where this runs (the launcher): `maskstream` installed with the same apache-beam
# (or run it from the worker image: `docker run --entrypoint maskstream "$WORKER_IMAGE" build ...`),
# Google credentials (`gcloud auth application-default login` or a service account), the
# Dataflow API enabled, and for the workers' service account read access to the image and
# read/write access to the bucket.
set -euo pipefail

require() {  # require NAME DESCRIPTION: exits with a clear message when $NAME is unset or empty
  if [[ -z "${!1:-}" ]]; then
    echo "error: set $1 ($2)" >&2
    exit 2
  fi
}
require GCP_PROJECT "the Google Cloud project that runs and pays for the job"
require GCP_REGION "the Dataflow region, e.g. europe-west1; keep it near the bucket"
require GCS_BUCKET "a gs:// bucket (or prefix) for Dataflow's temporary and staging files"
require WORKER_IMAGE "the pushed dataflow-worker image (docker build --target dataflow-worker)"
require INPUT "the domain corpus: gs:// files or globs (the same as for maskstream stats)"
require STATS "the gs:// output folder of maskstream stats"
require SEEDS "the gs:// seeds.json of maskstream seeds"
require OUTPUT "the gs:// dataset root; the build adds ROOT/VERSION/ and updates ROOT/latest"

MASKSTREAM="${MASKSTREAM:-maskstream}"
# The tokenizer and encoder, by hub name: workers download it. (The default of `--model` is the
# launcher's local offline MiniLM when that package is installed, a path workers do not have.)
MODEL="${MODEL:-sentence-transformers/all-MiniLM-L6-v2}"
# Workers: n1-standard-8 runs 8 Python SDK processes (one per vCPU), each with its own tokenizer
# and encoder, 3.75 GB each; if workers run out of memory, use n1-highmem-8 (6.5 GB per vCPU).
MACHINE_TYPE="${MACHINE_TYPE:-n1-standard-8}"
MAX_WORKERS="${MAX_WORKERS:-20}"
JOB_NAME="${JOB_NAME:-maskstream-build-$(date -u +%Y%m%d-%H%M%S)}"
# INPUT may hold several patterns separated by spaces; split it without expanding its globs here.
set -f
read -r -a INPUTS <<< "$INPUT"
set +f

# maskstream build flags:
# --model              the tokenizer and encoder (see MODEL above).
# --encoder-threads=1  torch threads per SDK process: Dataflow already runs one process per vCPU,
#                      so more threads per process would only oversubscribe the cores.
# Beam / Dataflow flags:
# --runner             Dataflow executes the pipeline (the default is the local DirectRunner).
# --project            the project whose Dataflow service runs the job and is billed.
# --region             the regional endpoint the job runs in (workers, shuffle, logs).
# --job_name           the name shown in the Dataflow console (unique among running jobs).
# --temp_location      gs:// prefix for files the job writes while it runs (e.g. the staged
#                      shards that Beam's writers rename into place when a bundle commits).
# --staging_location   gs:// prefix where the launcher uploads the pipeline graph and its files.
# --sdk_container_image  the worker image: maskstream, torch (CPU) and Beam 2.77.0 are already
#                      installed there, so workers start without pip installing anything.
# --sdk_location=container  use the Beam SDK inside that image instead of uploading one from the
#                      launcher (they must be the same version; the Dockerfile test checks it).
# --experiments=use_runner_v2  custom containers need Dataflow Runner v2 (the default for Python
#                      pipelines since Beam 2.45; stated so that the job does not depend on it).
# --machine_type       worker VM type (see MACHINE_TYPE above).
# --max_num_workers    the autoscaling ceiling: what the job may cost per hour at most.
# --disk_size_gb       worker boot disk; 50 GB holds the image (~4 GB), the model and shuffle spill.
exec $MASKSTREAM build \
  --input "${INPUTS[@]}" \
  --stats "$STATS" \
  --seeds "$SEEDS" \
  --output "$OUTPUT" \
  --model="$MODEL" \
  --encoder-threads=1 \
  --runner=DataflowRunner \
  --project="$GCP_PROJECT" \
  --region="$GCP_REGION" \
  --job_name="$JOB_NAME" \
  --temp_location="${GCS_BUCKET%/}/dataflow/temp" \
  --staging_location="${GCS_BUCKET%/}/dataflow/staging" \
  --sdk_container_image="$WORKER_IMAGE" \
  --sdk_location=container \
  --experiments=use_runner_v2 \
  --machine_type="$MACHINE_TYPE" \
  --max_num_workers="$MAX_WORKERS" \
  --disk_size_gb=50 \
  "$@"
