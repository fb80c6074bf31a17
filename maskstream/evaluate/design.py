"""What an evaluation compares and how its texts are split: the arms, the settings, the folds.

The design (docs/evidence.md): the labeled texts are clustered by near-duplication and the clusters
dealt into `folds` folds, stratified by label. For each fold, every arm pretrains (TAPT) on the task's
unlabeled text minus every near-duplicate of the fold's texts, and is judged on the fold's texts by a
probe predicted out of fold. An (arm, seed)'s score is the mean over folds of macro-F1, so every
labeled text is judged, by a model that never read it or its near-duplicates.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from maskstream.schemas.splits import hash_fraction


@dataclass(frozen=True)
class Arm:
    """One arm: how its dataset is made (extra `maskstream stats` / `seeds` / `build` flags; with stats
    flags the arm gets statistics of its own, `{background}` standing for the fold's cleaned background
    corpus) and how its TAPT masks (`maskstream train` flags). `pretrain=False`: the model as it is."""

    title: str
    train: tuple[str, ...] = ()
    seeds: tuple[str, ...] = ()
    build: tuple[str, ...] = ()
    stats: tuple[str, ...] = ()
    pretrain: bool = True

    @property
    def dataset(self) -> str:
        """Name of the dataset this arm trains on: `main` without extra stats/seeds/build flags."""
        if not self.stats and not self.seeds and not self.build:
            return "main"
        flags = [self.seeds, self.build] + ([self.stats] if self.stats else [])
        return "v" + hashlib.sha256(json.dumps(flags).encode()).hexdigest()[:10]

    @property
    def needs_background(self) -> bool:
        return "{background}" in self.stats


# A new arm is one entry here.
ARMS: dict[str, Arm] = {
    "none": Arm("no task-adaptive pretraining (the model as given)", pretrain=False),
    "random": Arm("random masking (BERT, 15%)", train=("--strategy", "random")),
    "whole_word": Arm("whole-word random masking", train=("--strategy", "whole_word")),
    "difference": Arm("difference masking, the paper's map (K=20 seeds, nearest seed, 15%)",
                      train=("--strategy", "difference")),
    "rank_map": Arm("difference masking, the reference implementation's rank map", train=("--strategy", "difference"),
                    build=("--weighting", "rank")),
    "background_sharpened": Arm("difference masking, background-contrast seeds and sharpened map "
                                "(sharpness 8, floor 0.01)", train=("--strategy", "difference"),
                                stats=("--background-input", "{background}"), seeds=("--contrast", "background"),
                                build=("--sharpness", "8", "--floor", "0.01")),
    # The peers (issue 52), exploratory: one dataset with the peer signals serves all three.
    "pmi_span": Arm("PMI-Masking: collocations of the task corpus masked as one unit", train=("--strategy", "pmi_span"),
                    build=("--peer-signals",)),
    "difference_pmi_span": Arm("PMI-Masking's units chosen by difference-masking probability",
                               train=("--strategy", "difference_pmi_span"), build=("--peer-signals",)),
    "informask": Arm("InforMask: masks weighted by each word's informative relevance",
                     train=("--strategy", "informask"), build=("--peer-signals",)),
}
BASELINE = "random"  # every arm is compared with it, paired by seed
PRIMARY = ("difference", "random")  # the one confirmatory comparison; the others are exploratory (Holm)
CONTROL = ("random", "none")  # TAPT must move the readout at all
PRIMARY_METRIC = "macro_f1"  # the probe is fitted with balanced class weights: accuracy would reward the majority
PROBE_GRID = (0.01, 0.1, 1.0, 10.0)  # the probe's inverse regularization C, chosen on `none` per fold
HELD_OUT_FRACTION = 0.05  # TAPT rows held out for its own loss curve (`maskstream train --held-out-fraction`)
EVAL_SAMPLES = 64  # held-out rows scored at the end of TAPT
RESAMPLES = 2000  # of the hierarchical bootstrap
MIN_DECISION_SEEDS = 5  # fewer: the bootstrap over seeds is degenerate, and the report makes no decision


@dataclass
class EvaluateConfig:
    """Everything that decides an evaluation, checked on creation. Paths may be local; the results
    record only file names and sha256."""

    labeled: str
    output: Path
    model: str
    text_field: str = "text"
    label_field: str = "label"
    domain_corpus: list[str] | None = None  # unlabeled task text for TAPT (default: the labeled texts)
    background_corpus: list[str] | None = None  # general text for background-contrast arms
    general_corpus: list[str] | None = None  # the model's own pretraining text, checked for leaks
    arms: tuple[str, ...] = ("none", "random", "difference")
    seeds: tuple[int, ...] = (0, 1, 2, 3, 4)  # MIN_DECISION_SEEDS: a default run can reach a decision
    # passes and learning rate: issue 74's pilot for the shipped masked LM (benchmarks/effect/DEFAULT_PILOT.md,
    # rule 4): its one cell whose control gained +1 point, above the 3,600 s ceiling (10,515 s projected)
    passes: tuple[float, ...] = (8.0,)  # TAPT passes; several: a pilot chooses (PILOT_RULE)
    steps: int | None = None  # TAPT steps a fold instead of passes: the length does not grow with the corpus
    pilot_seeds: tuple[int, ...] = (100, 101)
    batch_size: int = 32
    learning_rate: float = 3e-4
    max_length: int = 128
    folds: int = 2
    probe_folds: int = 5
    margin: float = 0.01  # equivalence margin, in macro-F1 (0.01 = 1 point)
    threads: int = 1
    device: str = "cpu"
    work: Path | None = None  # scratch (datasets, TAPT models); default OUTPUT/work

    def __post_init__(self) -> None:
        unknown = [a for a in self.arms if a not in ARMS]
        if unknown or not self.arms:
            raise ValueError(f"arms {list(self.arms)}: unknown {unknown}; choose from {sorted(ARMS)}")
        if "random" not in self.arms:
            raise ValueError("arms must include `random`: every arm is compared with it")
        if any(ARMS[a].needs_background for a in self.arms) and not self.background_corpus:
            raise ValueError(f"arms {[a for a in self.arms if ARMS[a].needs_background]} need --background-corpus")
        if self.steps is not None and len(self.passes) > 1:
            raise ValueError("--steps fixes the TAPT length: it takes no pilot of several --passes")
        if set(self.seeds) & set(self.pilot_seeds) and len(self.passes) > 1:
            raise ValueError("the pilot's seeds are not counted in the main run: choose other seeds")
        checks = {"folds": self.folds >= 2, "probe_folds": self.probe_folds >= 2, "batch_size": self.batch_size >= 1,
                  "max_length": self.max_length >= 8, "learning_rate": self.learning_rate > 0,
                  "passes": bool(self.passes) and all(p > 0 for p in self.passes), "seeds": bool(self.seeds),
                  "steps": self.steps is None or self.steps >= 1,
                  "margin": self.margin > 0, "threads": self.threads >= 1}
        bad = [name for name, ok in checks.items() if not ok]
        if bad:
            raise ValueError(f"out of range: {bad}")
        self.output = Path(self.output)
        self.work = Path(self.work) if self.work else self.output / "work"

    def deciding(self) -> dict:
        """The settings that decide a result (not seeds, paths, threads or the margin of the report)."""
        return {**{k: getattr(self, k) for k in ("text_field", "label_field", "batch_size", "learning_rate",
                                                 "max_length", "folds", "probe_folds", "device")},
                "probe_grid": PROBE_GRID, "held_out_fraction": HELD_OUT_FRACTION, "eval_samples": EVAL_SAMPLES}


def assign_folds(labels: list[str], cluster_of: list[int], cluster_keys: dict[int, str], folds: int) -> list[int]:
    """Fold of each text. Clusters are grouped by their most common label (ties: the first label in sorted
    order), ordered within the group by a hash of the cluster's contents, and cut into `folds` equal
    shares of the group's texts (a cluster goes where its middle text falls). Deterministic, independent
    of the file's order, every cluster whole in one fold."""
    members: dict[int, list[int]] = {}
    for i, c in enumerate(cluster_of):
        members.setdefault(c, []).append(i)
    by_label: dict[str, list[tuple[float, int]]] = {}
    for cluster, group in members.items():
        counts = Counter(labels[i] for i in group)
        label = min(counts, key=lambda name: (-counts[name], name))
        by_label.setdefault(label, []).append((hash_fraction(cluster_keys[cluster]), cluster))
    fold_of = [0] * len(labels)
    for _, groups in sorted(by_label.items()):
        groups.sort()
        total, before = sum(len(members[c]) for _, c in groups), 0
        for _, cluster in groups:
            middle = (before + len(members[cluster]) / 2) / total
            for i in members[cluster]:
                fold_of[i] = min(int(math.floor(middle * folds)), folds - 1)
            before += len(members[cluster])
    return fold_of
