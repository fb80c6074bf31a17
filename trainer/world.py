"""Where a process runs, as MosaicML streaming's `World`: its rank among the training processes (and
its device), and its DataLoader worker among its rank's. `maskstream train` sets its ranks up from it. Every reader (the dataset, a text source, the text collator) asks
`World.detect()` instead of reading torch.distributed, the environment or `get_worker_info()` itself."""

from __future__ import annotations

import dataclasses
import os

import torch
from torch.utils.data import get_worker_info


@dataclasses.dataclass(frozen=True)
class World:
    """rank of world_size ranks; worker of workers DataLoader workers of that rank (0 of 1 in the
    training process itself, which reads when a loader has no workers)."""

    rank: int = 0
    world_size: int = 1
    worker: int = 0
    workers: int = 1
    in_worker_process: bool = False  # a DataLoader worker (one worker is 0 of 1 too, in another process)
    local_rank: int = 0  # the rank's GPU on its machine (torchrun's LOCAL_RANK)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def device(self) -> torch.device:
        """The rank's device: its GPU where there is one, else the CPU."""
        return torch.device("cuda", self.local_rank) if torch.cuda.is_available() else torch.device("cpu")

    @classmethod
    def detect(cls, rank: int | None = None, world_size: int | None = None) -> World:
        """This process's world. The ranks: `rank` and `world_size` where given, else torch.distributed's
        once initialized, else torchrun's environment (RANK, WORLD_SIZE), else 0 of 1. The worker: the
        DataLoader's worker info inside a worker process, else 0 of 1."""
        if rank is None or world_size is None:
            if torch.distributed.is_available() and torch.distributed.is_initialized():
                found = torch.distributed.get_rank(), torch.distributed.get_world_size()
            else:
                found = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
            rank = found[0] if rank is None else rank
            world_size = found[1] if world_size is None else world_size
        local_rank = int(os.environ.get("LOCAL_RANK", 0))
        info = get_worker_info()
        if info is None:
            return cls(rank, world_size, local_rank=local_rank)
        return cls(rank, world_size, info.id, info.num_workers, in_worker_process=True, local_rank=local_rank)


def rows_per_rank(rows: int, world_size: int) -> int:
    """The rows each of `world_size` ranks reads of an order of `rows`: ceil(rows / world_size), the order
    wrapping around to its start for the last rank (the remainder policy, maskstream.trainer.dataset)."""
    return -(-rows // world_size)
