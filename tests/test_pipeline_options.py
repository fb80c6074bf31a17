"""Beam flags given to maskstream's pipeline commands reach Beam's PipelineOptions unchanged.

`beam.Pipeline` is replaced by a stand-in that records the options it is built with and stops
the command there, so no pipeline runs and no Dataflow job is submitted.
"""

from __future__ import annotations

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import (
    GoogleCloudOptions,
    PipelineOptions,
    StandardOptions,
    WorkerOptions,
)

from maskstream.cli import main

DATAFLOW_FLAGS = [
    "--runner=DataflowRunner",
    "--project=p",
    "--region=r",
    "--temp_location=gs://b/t",
    "--staging_location=gs://b/s",
    "--sdk_container_image=europe-docker.pkg.dev/p/r/worker:1",
    "--sdk_location=container",
    "--experiments=use_runner_v2",
    "--machine_type=n1-standard-8",
    "--max_num_workers=7",
]


class Intercepted(Exception):
    """Raised by the stand-in Pipeline: the command stops before anything runs."""


@pytest.fixture()
def captured(monkeypatch: pytest.MonkeyPatch) -> list[PipelineOptions]:
    options: list[PipelineOptions] = []

    def pipeline(*args, options: PipelineOptions | None = None, **kwargs):
        options_list.append(options)
        raise Intercepted

    options_list = options
    monkeypatch.setattr(beam, "Pipeline", pipeline)
    # What reaches Beam is checked here, not the (made-up) buckets of the flags.
    monkeypatch.setattr("maskstream.cli.check_reachable", lambda urls, timeout: None)
    return options


def check_dataflow_options(options: PipelineOptions, flags: list[str]) -> None:
    # Exactly what Beam itself makes of the same flags, nothing added or lost ...
    assert options.get_all_options(drop_default=True) == PipelineOptions(flags).get_all_options(drop_default=True)
    # ... which is what the user asked for.
    assert options.view_as(StandardOptions).runner == "DataflowRunner"
    cloud = options.view_as(GoogleCloudOptions)
    assert (cloud.project, cloud.region, cloud.temp_location, cloud.staging_location) == ("p", "r", "gs://b/t", "gs://b/s")
    workers = options.view_as(WorkerOptions)
    assert (workers.machine_type, workers.max_num_workers) == ("n1-standard-8", 7)
    assert workers.sdk_container_image == "europe-docker.pkg.dev/p/r/worker:1"
    assert "use_runner_v2" in options.view_as(beam.options.pipeline_options.DebugOptions).experiments


def test_stats_passes_dataflow_flags_unchanged(captured: list[PipelineOptions], sample_corpus, tmp_path) -> None:
    # Beam flags before, between and after maskstream's own, in both `--flag=value` and `--flag value` forms.
    flags = [*DATAFLOW_FLAGS[:2], "--region", "r", *DATAFLOW_FLAGS[3:]]
    argv = ["stats", *flags[:2], "--input", str(sample_corpus), *flags[2:6], "--output", str(tmp_path / "stats"),
            *flags[6:]]
    with pytest.raises(Intercepted):
        main(argv)
    (options,) = captured
    check_dataflow_options(options, flags)
    assert not (tmp_path / "stats").exists()


def test_stats_default_is_the_direct_runner(captured: list[PipelineOptions], sample_corpus, tmp_path) -> None:
    with pytest.raises(Intercepted):
        main(["stats", "--input", str(sample_corpus), "--output", str(tmp_path / "stats"), "--direct_num_workers=2"])
    (options,) = captured
    assert options.get_all_options(drop_default=True) == {"direct_num_workers": 2}
    assert options.view_as(StandardOptions).runner is None  # Beam's default: the DirectRunner


def test_build_passes_dataflow_flags_unchanged(captured: list[PipelineOptions], sample_corpus, tmp_path) -> None:
    from tests.pipelines.test_build import build_args, make_inputs

    inputs = make_inputs(sample_corpus, tmp_path / "in", 5)
    flags = [*DATAFLOW_FLAGS[:2], "--region", "r", *DATAFLOW_FLAGS[3:]]
    args = build_args(inputs, str(tmp_path / "dataset"), "--version", "v1")
    with pytest.raises(Intercepted):
        main([args[0], *flags[:4], *args[1:], *flags[4:], "--encoder-threads=1"])
    (options,) = captured
    check_dataflow_options(options, flags)
    # Nothing but the version folder and its seeds.json exists: no manifest, no `latest`.
    assert sorted(p.name for p in (tmp_path / "dataset").rglob("*")) == ["seeds.json", "v1"]


@pytest.mark.slow
def test_dask_runner_is_refused_with_the_reason(subprocess_env, tmp_path):
    """Beam's DaskRunner drops all but the last sink and empties tagged outputs
    (benchmarks/dask_runner.py): the command line refuses it instead of writing wrong outputs."""
    from tests.conftest import run_cli

    result = run_cli(["stats", "--input", "data/debian-science.jsonl", "--output", str(tmp_path / "s"),
                      "--runner=apache_beam.runners.dask.dask_runner.DaskRunner"], subprocess_env, check=False)
    assert result.returncode == 2
    assert "DaskRunner runs only a pipeline's last sink" in result.stderr
    assert not (tmp_path / "s").exists()
