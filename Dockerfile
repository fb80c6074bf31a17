# maskstream images, one multi-stage file (no target = `cli`, the command-line image):
#
#   docker build -t maskstream .                                   # cli: the `maskstream` command on CPU
#   docker build --target dataflow-worker -t REGION-docker.pkg.dev/P/R/maskstream-worker .
#   docker build --target trainer -t REGION-docker.pkg.dev/P/R/maskstream-trainer .
#
# dataflow-worker: Dataflow's custom SDK container (--sdk_container_image) and, the same image,
#   the Flex Template launcher (deploy/flex_template_metadata.json). Its Beam must be exactly the
#   pinned apache-beam of pyproject.toml (the launcher and the workers must agree on Beam's
#   version); tests/test_deploy_files.py checks this.
# trainer: `maskstream train` / `finetune` on CUDA GPUs (torchrun, deploy/k8s-train-job.yaml),
#   without Beam: the trainer never imports it.
ARG PYTHON_VERSION=3.11
ARG BEAM_VERSION=2.77.0
ARG TORCH_VERSION=2.13.0

# ---------------------------------------------------------------------------------------- wheel
# maskstream built once as a wheel; the other stages install it. Only what the package needs is
# copied, so edits to tests or docs do not invalidate the layers below.
FROM python:${PYTHON_VERSION}-slim AS wheel
ENV PIP_NO_CACHE_DIR=1
WORKDIR /src
COPY pyproject.toml README.md LICENSE ./
COPY maskstream maskstream
COPY schemas schemas
COPY mask_signal mask_signal
COPY pipelines pipelines
COPY trainer trainer
RUN pip wheel --no-deps --wheel-dir /wheels .

# ------------------------------------------------------------------------------ dataflow-worker
FROM apache/beam_python${PYTHON_VERSION}_sdk:${BEAM_VERSION} AS dataflow-worker
ARG TORCH_VERSION
ENV PIP_NO_CACHE_DIR=1 PYTHONUNBUFFERED=1
# torch first, pinned, from the CPU index: workers embed words on CPU, and an unpinned torch from
# PyPI pulls several GB of CUDA libraries. maskstream's own pin `apache-beam[gcp]==BEAM_VERSION`
# is satisfied by the image's Beam, so pip leaves it as it is.
RUN pip install torch==${TORCH_VERSION} --index-url https://download.pytorch.org/whl/cpu
COPY --from=wheel /wheels /wheels
RUN pip install /wheels/maskstream-*.whl && rm -rf /wheels
# Flex Template launcher: the same image launches the job (deploy/flex_template_main.py builds
# the pipeline) and runs its workers. Dataflow starts the launcher binary; the workers keep the
# SDK image's own entrypoint (/opt/apache/beam/boot), which is not changed here.
COPY --from=gcr.io/dataflow-templates-base/python311-template-launcher-base:latest \
     /opt/google/dataflow/python_template_launcher /opt/google/dataflow/python_template_launcher
COPY deploy/flex_template_main.py /template/flex_template_main.py
ENV FLEX_TEMPLATE_PYTHON_PY_FILE=/template/flex_template_main.py

# -------------------------------------------------------------------------------------- trainer
# Beam is left out on purpose (100 MB installed, plus the Google Cloud clients of its [gcp] extras
# and their pins on protobuf and grpc, none of which the trainer uses): the wheel goes in with --no-deps, followed by exactly what
# `maskstream train/finetune`, `schemas/` and `mask_signal/` import (tests/test_deploy_files.py checks the list
# against the trainer's imports, and that the CLI starts without apache_beam). torch is the tested
# version (TORCH_VERSION, the Makefile's pin) from PyPI, whose Linux wheel carries its CUDA
# libraries: the host needs only the NVIDIA driver and container toolkit.
FROM python:${PYTHON_VERSION}-slim AS trainer
ARG TORCH_VERSION
ENV PIP_NO_CACHE_DIR=1 PYTHONUNBUFFERED=1
RUN pip install torch==${TORCH_VERSION}
RUN pip install "pyarrow>=14" "fsspec>=2023.6" "gcsfs>=2023.6" "transformers>=4.56" "tokenizers>=0.15" \
    "numpy>=1.24" "scipy>=1.10" "matplotlib>=3.7" "tqdm>=4.65" "safetensors>=0.4" "tensorboard>=2.14"
COPY --from=wheel /wheels /wheels
RUN pip install --no-deps /wheels/maskstream-*.whl && rm -rf /wheels
COPY deploy/train_torchrun.sh /opt/maskstream/deploy/train_torchrun.sh
WORKDIR /workspace
ENTRYPOINT ["maskstream"]
CMD ["train", "--help"]

# ------------------------------------------------------------------------------------------ cli
# The command line on CPU: launches pipelines (DirectRunner inside the container, or Dataflow
# with --runner=DataflowRunner), builds seeds, runs the trainer on CPU.
FROM python:${PYTHON_VERSION}-slim AS cli
ARG TORCH_VERSION
ENV PIP_NO_CACHE_DIR=1 PYTHONUNBUFFERED=1
RUN pip install torch==${TORCH_VERSION} --index-url https://download.pytorch.org/whl/cpu
COPY --from=wheel /wheels /wheels
RUN pip install /wheels/maskstream-*.whl && rm -rf /wheels
# Run as a user without privileges; outputs go to mounted folders or gs://.
RUN useradd --create-home maskstream
USER maskstream
WORKDIR /home/maskstream
ENTRYPOINT ["maskstream"]
CMD ["--help"]
