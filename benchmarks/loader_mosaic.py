"""The MosaicML side of `benchmarks/loader.py`, run by it in an environment with mosaicml-streaming
(0.13 needs another torch and torchvision than maskstream's; see benchmarks/loader.py).

    MOSAIC_PYTHON benchmarks/loader_mosaic.py VERSION_FOLDER WORK_DIR BATCH_SIZE

Converts the version's shards to MDS (`streaming.MDSWriter`, no compression), then reads them with
`streaming.StreamingDataset` (shuffled) through a torch DataLoader with 0 and 2 workers, two epochs,
collating with maskstream's own `collate_sequences` (loaded from its file: this environment does not
install maskstream). Prints one JSON line: samples/s per worker count and epoch.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import torch
from streaming import MDSWriter, StreamingDataset

COLUMNS = {"input_ids": "ndarray:int32", "word_ids": "ndarray:int32", "special_tokens_mask": "ndarray:int8",
           "mask_probability": "ndarray:float32", "sample_index": "int64"}


def collate_module():
    path = Path(__file__).resolve().parents[1] / "trainer" / "collate.py"
    spec = importlib.util.spec_from_file_location("maskstream_collate", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    version, work, batch_size = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
    manifest = json.loads((version / "manifest.json").read_text())
    pad = manifest["tokenizer"]["pad_token_id"]
    mds = work / "mds"
    index = 0
    with MDSWriter(out=str(mds), columns=COLUMNS) as writer:
        for shard in manifest["shards"]:
            for row in pq.read_table(version / shard["path"], columns=list(COLUMNS)[:-1]).to_pylist():
                writer.write({"input_ids": np.asarray(row["input_ids"], np.int32),
                              "word_ids": np.asarray(row["word_ids"], np.int32),
                              "special_tokens_mask": np.asarray(row["special_tokens_mask"], np.int8),
                              "mask_probability": np.asarray(row["mask_probability"], np.float32),
                              "sample_index": index})
                index += 1
    collate = collate_module().collate_sequences
    figures = {"rows": index}
    for workers in (0, 2):
        dataset = StreamingDataset(local=str(mds), shuffle=True, shuffle_seed=0, batch_size=batch_size)
        loader = torch.utils.data.DataLoader(dataset, batch_size=batch_size, num_workers=workers,
                                             collate_fn=lambda samples: collate(samples, pad))
        for epoch in (0, 1):
            start = time.perf_counter()
            samples = sum(len(batch["sample_index"]) for batch in loader)
            figures[f"workers{workers}_epoch{epoch}"] = samples / (time.perf_counter() - start)
        del loader, dataset
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
