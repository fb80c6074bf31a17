"""Dataflow dry runs: build a pipeline's Dataflow job offline and say how big it is.

`--runner=DataflowRunner --dry_run=True --no_auth` (Beam's own flags) make the DataflowRunner
translate the pipeline into the job it would submit, and return it instead of sending it:
no credentials, no network. A maskstream command that sees those flags writes nothing and
reads no corpus bytes (only file listings); it prints one line with the job's size and the
number of transforms, so a user can check a job before paying for it.

The job's size is what Dataflow receives: the serialized pipeline proto (Runner v2 stages it
as a file) plus the serialized job request. Dataflow refuses job requests above about 10 MB,
which is why nothing that grows with the corpus or its vocabulary may live in the graph.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

DATAFLOW_JOB_LIMIT_BYTES = 10 * 1024 * 1024  # Dataflow's documented job-request limit, about 10 MB


def is_dry_run(beam_args: Sequence[str]) -> bool:
    """Whether Beam's flags ask for a dry run (`--dry_run=True`), parsed as Beam parses them."""
    if not any(arg.startswith("--dry_run") for arg in beam_args):
        return False  # no Beam import for the common case
    # heavy: Beam loads only when a pipeline runs (--help and the trainer never import it)
    from apache_beam.options.pipeline_options import PipelineOptions, TestOptions

    return bool(PipelineOptions(list(beam_args)).view_as(TestOptions).dry_run)


@dataclasses.dataclass(frozen=True)
class JobSize:
    pipeline_proto_bytes: int
    job_request_bytes: int
    transforms: int

    @property
    def total_bytes(self) -> int:
        return self.pipeline_proto_bytes + self.job_request_bytes

    def line(self, command: str) -> str:
        share = self.total_bytes / DATAFLOW_JOB_LIMIT_BYTES
        return (f"maskstream {command}: dry run: Dataflow job of {self.total_bytes:,} bytes "
                f"(pipeline proto {self.pipeline_proto_bytes:,} + job request {self.job_request_bytes:,}; "
                f"{share:.1%} of Dataflow's ~10 MB limit), {self.transforms} transforms; nothing was "
                f"written, no corpus byte was read and the remote paths were not checked")


def job_size(result: Any) -> JobSize:
    """The size of the job that a dry-run `DataflowRunner` returned (`pipeline.run()`'s result)."""
    job = getattr(result, "job", None)
    if job is None:
        raise ValueError("the pipeline result holds no Dataflow job: was it run with "
                         "--runner=DataflowRunner --dry_run=True?")
    proto = job.proto_pipeline
    return JobSize(
        pipeline_proto_bytes=len(proto.SerializeToString()),
        job_request_bytes=len(type(job.proto).serialize(job.proto)),
        transforms=len(proto.components.transforms),
    )
