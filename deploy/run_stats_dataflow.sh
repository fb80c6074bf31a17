#!/usr/bin/env bash
# Runs `maskstream stats` on Google Cloud Dataflow.
#
#   GCP_PROJECT=my-project GCP_REGION=europe-west1 GCS_BUCKET=gs://my-bucket \
#   INPUT='gs://my-bucket/corpus/*.jsonl' OUTPUT=gs://my-bucket/stats \
#   deploy/run_stats_dataflow.sh [more maskstream stats or Beam flags...]
#
# Needs `maskstream` installed where this runs (the launcher), Google credentials
# (`gcloud auth application-default login` or a service account), the Dataflow API enabled,
# and read/write access to the bucket for the Dataflow worker service account.
set -euo pipefail
cd "$(dirname "$0")/.."

require() {  # require NAME DESCRIPTION: exits with a clear message when $NAME is unset or empty
  if [[ -z "${!1:-}" ]]; then
    echo "error: set $1 ($2)" >&2
    exit 2
  fi
}
require GCP_PROJECT "the Google Cloud project that runs and pays for the job"
require GCP_REGION "the Dataflow region, e.g. europe-west1; keep it near the bucket"
require GCS_BUCKET "a gs:// bucket (or prefix) for Dataflow's temporary and staging files"
require INPUT "the domain corpus: gs:// files or globs"
require OUTPUT "the gs:// folder for word_stats-*.parquet, summary.json and rejects"

MASKSTREAM="${MASKSTREAM:-maskstream}"
# INPUT may hold several patterns separated by spaces; split it without expanding its globs here.
set -f
read -r -a INPUTS <<< "$INPUT"
set +f

# --runner            Dataflow executes the pipeline (default would be the local DirectRunner).
# --project           the project whose Dataflow service runs the job and is billed.
# --region            the regional endpoint the job runs in (workers, shuffle, logs).
# --temp_location     gs:// prefix for files the job writes while it runs (e.g. Beam's staged
#                     write results before they are renamed into place).
# --staging_location  gs:// prefix where the launcher uploads the job's code and packages.
# --setup_file        builds this package (pyproject.toml) and installs it on every worker, so
#                     workers can import pipelines/, mask_signal/ and schemas/.
exec $MASKSTREAM stats \
  --input "${INPUTS[@]}" \
  --output "$OUTPUT" \
  --runner=DataflowRunner \
  --project="$GCP_PROJECT" \
  --region="$GCP_REGION" \
  --temp_location="${GCS_BUCKET%/}/dataflow/temp" \
  --staging_location="${GCS_BUCKET%/}/dataflow/staging" \
  --setup_file="$PWD/pyproject.toml" \
  "$@"
