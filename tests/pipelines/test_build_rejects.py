"""The build's rejects: written by the pipeline in sharded files and counted with a combine, so
that no worker holds them all (issue 31 item 4), even when every document is rejected."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import apache_beam as beam
import pytest
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to

from maskstream.cli import main
from maskstream.pipelines.corpus import Document
from maskstream.pipelines.dataset.beam.dataset_pipeline import Bookkeeping
from tests.pipelines.test_build import build_args, make_inputs

DOCUMENTS = 300


def read_rejects(version: Path) -> list[dict]:
    return [json.loads(line) for path in sorted(version.glob("rejects-*.jsonl")) for line in path.read_text().splitlines()]


@pytest.mark.slow
def test_a_build_that_rejects_every_document_writes_them_all_and_no_version(sample_corpus, tmp_path, caplog):
    inputs = make_inputs(sample_corpus, tmp_path / "in", DOCUMENTS)
    root = tmp_path / "dataset"
    # A wrong --text-field: every line of the corpus is a reject. --min-word-count leaves the
    # encoder only the seeds.
    with caplog.at_level(logging.ERROR, logger="maskstream.build"):
        code = main(build_args(inputs, str(root), "--version", "v1", "--text-field", "body",
                               "--min-word-count", "1000000"))
    assert code == 2
    rejects = read_rejects(root / "v1")
    assert len(rejects) == DOCUMENTS
    assert {r["reason"] for r in rejects} == {"no field 'body'"}
    assert sorted(r["location"] for r in rejects) == sorted(f"line {i}" for i in range(1, DOCUMENTS + 1))
    assert not (root / "v1" / "manifest.json").exists() and not (root / "latest").exists()
    assert "no document of" in caplog.text and "no field 'body'" in caplog.text


def list_collecting_transforms(pipeline: beam.Pipeline, under: str) -> list[str]:
    """Labels of the transforms below `under` that gather a whole PCollection into one list."""
    found: list[str] = []

    class Visitor(beam.pipeline.PipelineVisitor):
        def enter_composite_transform(self, node):
            self.visit_transform(node)

        def visit_transform(self, node):
            transform = node.transform
            fn = getattr(transform, "fn", None)
            if node.full_label.startswith(under) and (
                    isinstance(transform, beam.combiners.ToList)
                    or isinstance(fn, beam.combiners.ToListCombineFn)
                    or isinstance(getattr(fn, "fn", None), beam.combiners.ToListCombineFn)):
                found.append(node.full_label)

    pipeline.visit(Visitor())
    return found


@pytest.mark.slow
def test_bookkeeping_counts_rejects_with_a_combine_and_writes_them_sharded(tmp_path):
    """The DirectRunner holds every PCollection in memory whatever the graph, so what keeps a
    distributed worker's memory flat is checked on the graph: no step gathers the rejects into
    one list (the build's RejectList did, with ToList)."""
    rejects = [{"source": "c.jsonl", "location": f"line {i}", "reason": "no field 'text'"} for i in range(5000)]
    documents = [Document("c.jsonl", f"line {i}", "protein folding") for i in range(5000, 5010)]
    no_tokens = [{"source": "c.jsonl", "location": "line 5010", "reason": "no tokens"}]
    version = tmp_path / "v1"
    version.mkdir()
    pipeline = TestPipeline()
    books = {
        "documents": pipeline | "Documents" >> beam.Create(documents),
        "rejects": pipeline | "Rejects" >> beam.Create(rejects),
        "no_tokens": pipeline | "NoTokens" >> beam.Create(no_tokens),
    } | "Bookkeeping" >> Bookkeeping(str(version))
    assert_that(books["documents"], equal_to([{"read": 5010, "accepted": 9, "rejected": 5001}]))
    pipeline.run().wait_until_finish()
    assert list_collecting_transforms(pipeline, "Bookkeeping") == []
    written = read_rejects(version)
    assert sorted(written, key=lambda r: r["location"]) == sorted(rejects + no_tokens, key=lambda r: r["location"])


def test_the_check_finds_a_list_collecting_transform():
    @beam.ptransform_fn
    def Gather(pcoll):  # noqa: N802 (a transform's name)
        return pcoll | "All" >> beam.combiners.ToList()

    pipeline = beam.Pipeline()
    _ = pipeline | beam.Create([1, 2]) | "Bookkeeping" >> Gather()
    assert "Bookkeeping/All" in list_collecting_transforms(pipeline, "Bookkeeping")
