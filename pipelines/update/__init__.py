"""Stage 3: the update: incremental updates when input files change, watching a bucket,
and garbage collection of old versions."""
