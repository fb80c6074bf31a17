"""Writing a dataset version (shards, word table, manifest, `latest`) locally or on gs://, and checking
its shards against the manifest."""
