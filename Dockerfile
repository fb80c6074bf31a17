# maskstream's command line in a container: `docker run IMAGE stats --input gs://... --output gs://...`.
# It launches pipelines (DirectRunner inside the container, or Dataflow with --runner=DataflowRunner)
# and runs the trainer on CPU.
FROM python:3.11-slim

ENV PIP_NO_CACHE_DIR=1 PYTHONUNBUFFERED=1
WORKDIR /opt/maskstream

# torch first and pinned (a CPU build), so that installing the package below, which lists torch
# unpinned, keeps it instead of pulling the CUDA packages.
RUN pip install torch==2.13.0

# Only what the package needs, so that edits to tests or docs do not invalidate this layer.
COPY pyproject.toml README.md ./
COPY maskstream maskstream
COPY schemas schemas
COPY pipelines pipelines
COPY trainer trainer
RUN pip install .

# Run as a user without privileges; outputs go to mounted folders or gs://.
RUN useradd --create-home maskstream
USER maskstream
WORKDIR /home/maskstream
ENTRYPOINT ["maskstream"]
CMD ["--help"]
