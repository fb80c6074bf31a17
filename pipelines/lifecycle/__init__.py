"""Stage 3: the rerun lifecycle: incremental updates when input files change, watching a bucket,
and garbage collection of old versions."""
