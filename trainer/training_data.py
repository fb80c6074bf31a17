"""The data side of `maskstream train`: the ranks (torchrun or one process), the version read (or the
one a checkpoint was reading), the tokenizer checked against it, the loader or the `--mix` mixture,
the held-out batches, the follower of `latest`, and `TrainingData.batches()`, what the loop trains on."""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Iterator
from typing import Any, TextIO

import torch
import torch.distributed as dist
from transformers import AutoConfig, AutoTokenizer, PreTrainedTokenizerBase

from maskstream.models import default_mlm, display_name
from maskstream.schemas.manifest import vocab_hash
from maskstream.storage.lease import VersionLease
from maskstream.trainer.checkpoint import (
    SavedRun,
    set_rng_state,
)
from maskstream.trainer.config import TrainConfig
from maskstream.trainer.dataset import StreamingSequenceDataset
from maskstream.trainer.follow import LatestVersionFollower, dataset_root, poll_all_ranks, version_exists
from maskstream.trainer.held_out import collect_held_out
from maskstream.trainer.loader import ROWS_READ, StreamingDataLoader, build_dataloader
from maskstream.trainer.masking import BudgetSchedule, MaskingConfig
from maskstream.trainer.mixture import Mixture, build_mixture
from maskstream.trainer.plan import Plan
from maskstream.trainer.shard_cache import ShardCache
from maskstream.trainer.strategies import peer_columns
from maskstream.trainer.world import World

log = logging.getLogger("maskstream.train")


def shard_cache(config: TrainConfig) -> ShardCache | None:
    """The local shard cache --cache-dir and --cache-limit ask for, or None."""
    if not config.cache_dir:
        return None
    return ShardCache(config.cache_dir, config.cache_limit)


def masks_in_loader_workers(schedule_kind: str, mixed: bool) -> bool:
    """The loader workers draw the masks, on CPU and on a GPU alike, so that the training process only moves
    the batch (and the masked positions come with it: for the model types that take the 4-D mask,
    `objectives.FOUR_D_MASK_MODEL_TYPES`, nothing in the step waits for the device). A
    masking-budget schedule (it follows the samples trained, which workers do not see) and a mixture (each
    source its own strategy) mask after the transfer."""
    return schedule_kind == "constant" and not mixed


# Model types whose position ids start after the padding id (RoBERTa's): `max_position_embeddings` 514
# holds 512 tokens.
POSITIONS_AFTER_PADDING = frozenset({"roberta", "xlm-roberta", "xlm-roberta-xl", "camembert", "data2vec-text"})


def check_positions(model_name: str, max_length: int, dataset_url: str) -> None:
    """Exits in one line, before any work, when the dataset's rows (the build's --max-length) are longer than
    the model has position embeddings for: such a run would stop at its first long batch."""
    model_config = AutoConfig.from_pretrained(model_name)
    positions = getattr(model_config, "max_position_embeddings", None)
    if positions is None:  # no learned positions (rotary, relative): no such limit here
        return
    if model_config.model_type in POSITIONS_AFTER_PADDING:
        positions -= (model_config.pad_token_id or 0) + 1
    if max_length > positions:
        raise SystemExit(f"{dataset_url} holds rows of up to {max_length} tokens (its build's --max-length), "
                         f"{display_name(model_name)} has position embeddings for {positions}: build with --max-length "
                         f"{positions} or less, or train another --model")


def setup_world(seed: int) -> World:
    """This process's place among the torchrun ranks (RANK, LOCAL_RANK, WORLD_SIZE; one process: 0 of 1),
    its device made current and the process group started; seeds torch."""
    world = World.detect()
    if world.device.type == "cuda":
        torch.cuda.set_device(world.local_rank)
    if world.world_size > 1:
        dist.init_process_group("nccl" if world.device.type == "cuda" else "gloo")
    torch.manual_seed(seed)
    return world


def resume_versions(dataset: str, follow_latest: bool, saved: SavedRun) -> tuple[str, str]:
    """(the version the run started on, the version it was reading) for resuming the checkpoint state
    `saved` with `--dataset DATASET`. The held-out rows come from the first, training continues on the
    second: a run that followed newer versions (`--follow-latest`) stops on a later one than it started.
    DATASET may be their root, the version being read, or (with --follow-latest, as the run was
    started) the first version; anything else, or a version the root no longer holds, exits saying why."""

    started = saved.dataset_version
    root = started.rsplit("/", 1)[0]
    reading = f"{root}/{saved.positions[0].version}"  # every rank reads the same version
    given = dataset.rstrip("/")
    where = f"checkpoint {saved.path} was reading {reading}"
    if reading != started:
        where += f" (the run started on {started} and followed the latest version)"
    if given not in (root, reading, started):
        raise SystemExit(f"cannot resume: {where}; --dataset {dataset} is neither that version nor its root {root}")
    if given == started != reading and not follow_latest:
        raise SystemExit(f"cannot resume: {where}; --dataset {dataset} names the first version: resume with "
                         f"--dataset {root} or {reading}, or with --follow-latest as the run was started")
    for url, role in ((reading, "the version training continues on"), (started, "the held-out rows' version")):
        if not version_exists(url):
            raise SystemExit(f"cannot resume: {where}; {url} ({role}) is no longer a complete version in {root}")
    return started, reading


@dataclasses.dataclass
class TrainingData:
    """What the run reads: this rank's share of the version in use, as `(epoch, batch)` forever from
    `batches()`, the masking, and (rank 0) the held-out batches.

    Each pass over the loader continues from the dataset's position (mid-epoch after a resume) and a
    finished epoch moves on to the next. Held-out rows are dropped, so batches may be a little smaller
    than --batch-size. With --follow-latest an epoch boundary may move on to a newer version (the
    schedule stays as planned)."""

    config: TrainConfig
    world: World
    started_on: str  # version URL: the held-out rows and the run's identity
    dataset: StreamingSequenceDataset  # of the version in use
    model_name: str
    tokenizer: PreTrainedTokenizerBase
    masking: MaskingConfig  # at --mask-budget; `masking_at` gives a step's
    budget_schedule: BudgetSchedule
    eval_masking: MaskingConfig
    eval_batches: list[dict[str, Any]]
    follower: LatestVersionFollower | None
    mask_in_workers: bool
    resume_rng: dict[str, Any] | None = None  # RNG state to restore once the loader has started
    sample_log: TextIO | None = None  # --sample-log, open for appending
    mixture: Mixture | None = None  # with --mix
    loader: StreamingDataLoader | None = None  # none with --mix: a mixture has a loader per source
    lease: VersionLease | None = None  # rank 0's lease on the version read: gc spares it

    def __post_init__(self) -> None:
        self.loader = None if self.config.mix else self._make_loader()  # a mixture has a loader per source
        self.lease = VersionLease(self.dataset.version_url) if self.world.is_main else None
        if self.config.sample_log:
            self.sample_log = open(self.config.sample_log, "a", encoding="utf-8")  # noqa: SIM115 (closed by train)

    @property
    def source_names(self) -> list[str]:
        """What --sample-log and the metrics call each source: the domain's version, then --mix's."""
        return self.mixture.names if self.mixture is not None else [self.dataset.manifest.version]

    def log_samples(self, step: int, epoch: int, batch: dict[str, Any]) -> None:
        """--sample-log: one JSON line per sample of step `step` (1 = the first), written at once so
        that ranks appending to one file do not interleave within a batch. A mixture's rows carry
        their source's epoch."""
        if self.sample_log is None:
            return
        rank, count = self.world.rank, len(batch["sample_index"])
        sources = batch["source"].tolist() if "source" in batch else [0] * count
        epochs = batch["epoch"].tolist() if "epoch" in batch else [epoch] * count
        name = self.mixture.name_of if self.mixture is not None else lambda _s, _e: self.dataset.manifest.version
        self.sample_log.write("".join(
            json.dumps({"epoch": e, "source": name(s, e), "sample_index": i, "step": step, "rank": rank}) + "\n"
            for e, s, i in zip(epochs, sources, batch["sample_index"].tolist(), strict=True)))
        self.sample_log.flush()


    def masking_at(self, samples_done: int, plan: Plan) -> MaskingConfig:
        """The MaskingConfig of the step that starts with `samples_done` trained: the schedule's budget,
        from the first step's (0 trained) to the last's (a full step before the planned samples)."""
        if self.budget_schedule.kind == "constant":
            return self.masking
        step_samples = self.config.batch_size * self.config.grad_accumulation * self.world.world_size
        return dataclasses.replace(self.masking, budget=self.budget_schedule.at(samples_done, plan.total_samples,
                                                                                 step_samples))

    @property
    def pad_token_id(self) -> int:
        return self.dataset.manifest.tokenizer["pad_token_id"]

    def _make_loader(self) -> StreamingDataLoader:
        config = self.config
        return build_dataloader(self.dataset, batch_size=config.batch_size, num_workers=config.num_workers,
                                strategy=config.strategy, masking=self.masking, seed=config.seed,
                                mask_in_workers=self.mask_in_workers, pin_memory=self.world.device.type == "cuda",
                                held_out_fraction=config.held_out_fraction)

    def _epoch_finished(self) -> bool:
        return self.dataset.position().samples_consumed >= self.dataset.rows_per_rank()

    def _follow(self) -> None:
        """At an epoch boundary, moves on to the version `latest` names if it is newer and compatible."""
        switch = poll_all_ranks(self.follower, self.world.world_size)
        if switch is not None:
            next_epoch = self.dataset.epoch + 1
            self.dataset = StreamingSequenceDataset(switch.version_url, seed=self.config.seed, rank=self.world.rank,
                                                    world_size=self.world.world_size, cache=shard_cache(self.config),
                                                    peer_columns=peer_columns(self.config.strategy))
            if self.lease is not None:
                self.lease.move_to(switch.version_url)
            self.dataset.set_epoch(next_epoch)
            self.loader = self._make_loader()

    def _restore_rng(self) -> None:
        if self.resume_rng is not None:
            set_rng_state(self.resume_rng)
            self.resume_rng = None

    def batches(self) -> Iterator[tuple[int, dict[str, Any], int]]:
        """(epoch, batch, rows dealt) without end: the rows dealt count the held-out rows dropped from
        the batch, and those of batches wholly held out, skipped before it (what the plan counts).
        Without --mix the batch is the DataLoader's own object: the loader workers dropped the
        held-out rows before collation (maskstream.trainer.loader)."""

        if self.mixture is not None:
            self._restore_rng()
            dealt = 0
            for batch in self.mixture:  # the domain's held-out rows already left out (as the workers do)
                self.dataset = self.mixture.sources[0].dataset  # the domain's version in use (--follow-latest)
                dealt += self.mixture.batch_size
                if batch is not None:
                    yield self.dataset.epoch, batch, dealt
                    dealt = 0
        dealt = 0
        while True:
            # Starting an iteration, the DataLoader draws its workers' base seed from the global generator.
            # A run resumed at an epoch's end restores the generators before that, as the run it continues
            # was there; one resumed mid-epoch after it, so that dropout continues exactly where it stopped.
            if self._epoch_finished():
                if self.follower is not None:
                    self._follow()
                self._restore_rng()
            for batch in self.loader:
                self._restore_rng()
                # The workers dropped the held-out rows: the batch is the DataLoader's own (pinned on a GPU).
                dealt += batch.pop(ROWS_READ)
                if "sample_index" in batch:
                    yield self.dataset.epoch, batch, dealt
                    dealt = 0

    def loader_states(self) -> list[dict[str, Any]]:
        """Every rank's dataset state, so a resumed run (same world size) can restore each."""

        if self.mixture is not None:
            mixture = self.mixture.state_dict()
            state = {**mixture["sources"][0]["state"], "mixture": mixture}
        else:
            state = self.dataset.state_dict()
        if self.world.world_size == 1:
            return [state]
        states: list[Any] = [None] * self.world.world_size
        dist.all_gather_object(states, state)
        return states


def open_data(config: TrainConfig, world: World, saved: SavedRun | None) -> TrainingData:
    """The dataset (the version --dataset names, or when resuming the one the checkpoint was reading),
    the tokenizer checked against it, the masking, the held-out batches and the follower."""

    url = config.dataset
    if saved is not None:
        started, url = resume_versions(config.dataset, config.follow_latest, saved)
    dataset = StreamingSequenceDataset(url, seed=config.seed, rank=world.rank, world_size=world.world_size,
                                       cache=shard_cache(config), peer_columns=peer_columns(config.strategy))
    if saved is None:
        started = dataset.version_url
    model_name = config.model or default_mlm()
    tokenizer = AutoTokenizer.from_pretrained(model_name)
    manifest_vocab = dataset.manifest.tokenizer.get("vocab_size")
    if manifest_vocab is not None and manifest_vocab != len(tokenizer):
        raise SystemExit(f"{dataset.version_url} was tokenized with a vocabulary of {manifest_vocab} tokens, "
                         f"{display_name(model_name)}'s tokenizer has {len(tokenizer)}: build the dataset with this model's tokenizer")
    # Same size is not the same vocabulary: token ids would silently mean other tokens.
    manifest_hash = dataset.manifest.tokenizer.get("vocab_hash")
    if manifest_hash is not None and manifest_hash != vocab_hash(tokenizer.get_vocab()):
        raise SystemExit(f"{dataset.version_url} was tokenized with another vocabulary (hash {manifest_hash[:12]}) "
                         f"than {display_name(model_name)}'s tokenizer: build the dataset with this model's tokenizer")
    check_positions(model_name, int(dataset.manifest.config.get("max_length", 128)), dataset.version_url)
    masking = MaskingConfig.from_manifest(dataset.manifest, budget=config.mask_budget, whole_word=config.whole_word)
    schedule = BudgetSchedule.parse(config.mask_budget_schedule, config.mask_budget)
    eval_masking = MaskingConfig.from_manifest(dataset.manifest)  # the defaults, whatever this run's settings
    # A resumed run's --dataset may name either version: their root is the first one's folder.
    root = started.rsplit("/", 1)[0] if saved is not None else dataset_root(config.dataset, dataset.version_url)
    follower = (LatestVersionFollower(root, dataset.version_url, dataset.manifest,
                                      needs_peer_signals=bool(dataset.peer_columns))
                if config.follow_latest else None)
    pad_token_id = dataset.manifest.tokenizer["pad_token_id"]
    eval_batches = (collect_held_out(started, config.held_out_fraction, config.eval_samples, pad_token_id,
                                     config.batch_size, peer_columns=peer_columns(config.eval_strategy))
                    if world.is_main else [])
    # A changing budget is drawn where the step is known: in this process, not in the loader workers;
    # a mixture's rows are masked by source once their batch is drawn.
    in_workers = masks_in_loader_workers(schedule.kind, bool(config.mix))
    return TrainingData(config, world, started, dataset, model_name, tokenizer, masking, schedule, eval_masking,
                        eval_batches, follower, in_workers,
                        resume_rng=saved.rng if saved is not None else None)


def open_mixture(data: TrainingData) -> Mixture:
    """The --mix mixture around the domain's dataset, each source read by a loader of its own."""
    config = data.config
    try:
        return build_mixture(data.dataset, config.mix, data.tokenizer, strategy=config.strategy, seed=config.seed,
                             batch_size=config.batch_size, num_workers=config.num_workers, cache=shard_cache(config),
                             follow=config.follow_latest, domain_follower=data.follower, lease=data.lease,
                             pin_memory=data.world.device.type == "cuda",
                             held_out_fraction=config.held_out_fraction)
    except ValueError as e:  # a source that cannot be mixed: say which, in one line
        raise SystemExit(str(e)) from None
