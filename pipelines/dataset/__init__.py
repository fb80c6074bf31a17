"""Stage 2: the dataset build: tokens and their words, word similarity to the seeds, mask
probabilities, signal diagnostics, versioned Parquet shards, and the tools that check them."""
