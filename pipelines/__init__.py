"""`maskstream.pipelines`: the data side of maskstream, one folder per stage of the data flow:

- `corpus`: reading documents (JSONL, Parquet, text; local or `gs://`) and rejecting bad ones, for
  every stage (`read_corpus`: the same as Beam transforms);
- `statistics/`: word counts, TF-ICF, seed words (`maskstream stats`, `maskstream seeds`);
- `dataset/`: the dataset build: tokens and their words, word similarity, mask probabilities and their diagnostics,
  versioned Parquet shards (`maskstream build`, `check-tokenizer`, `inspect`);
- `update/`: reruns when the corpus changes (`update`, its caches and encoder process, `watch`)
  and retention (`gc`).

Beam runs `stats` and `build`; `update` and `watch` run the same steps in one process. Imports
`maskstream.schemas` and `maskstream.mask_signal`, never `maskstream.trainer`.
"""
