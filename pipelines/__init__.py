"""The Beam side of maskstream, one folder per stage of the data flow:

- `corpus`: reading documents (JSONL, Parquet, local or `gs://`) and rejecting bad ones, for every stage;
- `statistics/`: word counts, TF-ICF, seed words (`maskstream stats`, `maskstream seeds`);
- `dataset/`: tokens and their words, word similarity, mask probabilities and their diagnostics,
  versioned Parquet shards (`maskstream build`, `check-tokenizer`, `inspect`);
- `lifecycle/`: reruns when the corpus changes (`update`, `watch`) and retention (`gc`).

May import `schemas`, never `trainer`.
"""
