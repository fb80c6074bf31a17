"""Stage 2: the dataset build, one folder per role, each importing only the ones above it here:

- `core/`: Beam-free and pure: words as compact arrays (word_lookup, vocabulary), tokens and windows
  (sequences, tokenizer_facts), the word encoder, and per-token mask probabilities;
- `storage/`: writing a version (shards, word table, manifest, `latest`) and checking it;
- `inspect/`: the signal diagnostics, the text report, plots and the HTML page, the tokenizer check;
- `steps.py`: the build's steps as plain functions, called by both drivers
  (`maskstream build` here, `maskstream update` in pipelines/update/);
- `beam/`: those steps as Beam transforms (the build pipeline, tokenizing, RunInference);
- `driver.py`: `build_version`, which runs that pipeline.
"""
