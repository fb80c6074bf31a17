"""`maskstream.storage`: how maskstream writes, reads and keeps files, local or remote (fsspec).

- `publish`: the one way to make a written file visible (temporary name, then moved into place);
- `retry`: reads from object stores retried with backoff, then reported with their path;
- `lease`: a reader's lease on a dataset version, which `maskstream gc` spares;
- `remote_paths`: every remote path a command names checked before it starts.

Below both sides (`maskstream.pipelines` and `maskstream.trainer`) and beside `maskstream.schemas`,
which keeps the contracts; imports neither Beam nor torch.
"""
