"""Stage 2: the dataset build, one folder per role, each importing only the ones above it here:

- `core/`: Beam-free and pure: the word table's rows (vocabulary; the lookup and the per-token
  mask probabilities are `maskstream.mask_signal`'s), tokens and windows (sequences,
  tokenizer_facts), the word encoder, and the signal tallies and figures the build records
  (signal_tallies);
- `storage/`: writing a version (shards, word table, manifest, `latest`) and checking it;
- `inspect/`: what people read of a version: the signal's lines and plots, the HTML page, the
  tokenizer check;
- `steps.py`: the build's steps as plain functions, called by both drivers
  (`maskstream build` here, `maskstream update` in pipelines/update/);
- `beam/`: those steps as Beam transforms (the build pipeline, tokenizing, RunInference);
- `driver.py`: `build_version`, which runs that pipeline.
"""
