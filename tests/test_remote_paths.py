"""Unreachable or missing buckets fail fast, with one line naming the path, the cause and the fix."""

from __future__ import annotations

import argparse
import os
import socket
import time

import pytest

from maskstream.storage.remote_paths import remote_urls
from tests.conftest import run_cli


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens once the socket is closed


def _assert_one_line_error(result, path: str, *needles: str) -> str:
    assert result.returncode == 69, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr  # no traceback, no credential chatter
    assert lines[0].startswith("maskstream stats: error: ") and path in lines[0], lines[0]
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def test_remote_urls_found_in_flags_lists_and_beam_args():
    args = argparse.Namespace(input=["data/a.jsonl", "gs://a/x/*.jsonl"], output="gs://b/out", model="file:///m",
                              beam_args=["--runner=DataflowRunner", "--temp_location=gs://c/tmp"], workers=2)
    assert remote_urls(vars(args).values()) == ["gs://a/x/*.jsonl", "gs://b/out", "gs://c/tmp"]


@pytest.mark.slow
def test_missing_bucket_fails_fast_naming_the_path(gcs_emulator, subprocess_env, tmp_path):
    path = "gs://no-such-bucket-here/corpus/*.jsonl"
    start = time.monotonic()
    env = {**subprocess_env, "STORAGE_EMULATOR_HOST": gcs_emulator, "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false"}
    result = run_cli(["stats", "--input", path, "--output", str(tmp_path / "stats")], env, check=False)
    elapsed = time.monotonic() - start
    _assert_one_line_error(result, path, "'no-such-bucket-here' does not exist")
    assert elapsed < 30, elapsed


@pytest.mark.slow
def test_stopped_emulator_fails_within_the_timeout(subprocess_env, tmp_path):
    endpoint = f"http://127.0.0.1:{_closed_port()}"
    env = {**subprocess_env, "STORAGE_EMULATOR_HOST": endpoint, "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false"}
    path = "gs://some-bucket/corpus/*.jsonl"
    start = time.monotonic()
    result = run_cli(["--remote-timeout", "8", "stats", "--input", path, "--output", str(tmp_path / "stats")],
                     env, check=False)
    elapsed = time.monotonic() - start
    _assert_one_line_error(result, path, f"STORAGE_EMULATOR_HOST={endpoint}")
    assert elapsed < 8 + 10, elapsed  # the deadline plus interpreter start-up


@pytest.mark.slow
@pytest.mark.parametrize("timeout", [6])
def test_no_network_no_credentials_fails_within_the_timeout(subprocess_env, tmp_path, timeout):
    env = {k: v for k, v in subprocess_env.items() if k not in ("STORAGE_EMULATOR_HOST", "GOOGLE_APPLICATION_CREDENTIALS")}
    env["GCE_METADATA_HOST"] = f"127.0.0.1:{_closed_port()}"  # no metadata server, as on a laptop
    env["GCE_METADATA_IP"] = env["GCE_METADATA_HOST"]
    env["CLOUDSDK_CONFIG"] = str(tmp_path / "no-gcloud")  # no gcloud credentials either
    os.makedirs(env["CLOUDSDK_CONFIG"])
    path = "gs://maskstream-test-bucket/corpus/*.jsonl"
    start = time.monotonic()
    result = run_cli(["--remote-timeout", str(timeout), "stats", "--input", path, "--output", str(tmp_path / "s")],
                     env, check=False)
    elapsed = time.monotonic() - start
    line = _assert_one_line_error(result, path, "GOOGLE_APPLICATION_CREDENTIALS")
    assert elapsed < timeout + 10, (elapsed, line)
