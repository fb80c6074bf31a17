import fsspec
import pytest


@pytest.mark.slow
def test_fsspec_round_trip_through_emulator(gcs_bucket):
    url = f"{gcs_bucket}/dir/hello.txt"
    with fsspec.open(url, "w") as f:
        f.write("hello")
    with fsspec.open(url, "r") as f:
        assert f.read() == "hello"
    fs, path = fsspec.core.url_to_fs(gcs_bucket)
    assert fs.ls(path + "/dir", detail=False) == [path + "/dir/hello.txt"]
