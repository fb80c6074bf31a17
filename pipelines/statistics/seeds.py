"""Seed words: the top-K words of `maskstream stats` by TF-ICF (or by background contrast), after
filters, with their provenance, a Markdown report and a chart (`write_seeds`; the rules are in
`maskstream seeds --help`, maskstream/cli/seeds.py). The stats table has one row per word type
(millions for a large corpus), so it is streamed in record batches (`SeedRanking`): memory holds
the best rows seen so far, not the vocabulary; no Beam pipeline."""

from __future__ import annotations

import dataclasses
import json
import posixpath
from collections.abc import Iterator
from typing import Any

import fsspec

from maskstream.pipelines.statistics.seed_selection import (
    DEFAULT_MIN_DF,
    DEFAULT_MIN_LENGTH,
    DEFAULT_TOP_K,
    REPORT_CANDIDATES,
    SeedRanking,
    load_stop_words,
)
from maskstream.schemas.formulas import FORMULA_VERSIONS
from maskstream.schemas.tables import WORD_STATS_SCHEMA, check_schema

STATS_BATCH_ROWS = 65_536  # word-stats rows held at once while ranking
CONTRASTS = ("general", "background")
SCORE_COLUMN = {"general": "tf_icf", "background": "contrast"}


def word_stats_dataset(stats_dir: str) -> Any:
    """The `word_stats-*.parquet` of a stats folder as one pyarrow dataset (schema checked, nothing read)."""
    # heavy: this pyarrow module loads only when data is read: importing this module stays light
    import pyarrow.dataset as ds

    fs, path = fsspec.core.url_to_fs(stats_dir)
    files = sorted(fs.glob(posixpath.join(path, "word_stats-*.parquet")))
    if not files:
        raise FileNotFoundError(f"no word_stats-*.parquet in {stats_dir} (run `maskstream stats` first)")
    dataset = ds.dataset(files, filesystem=fs, format="parquet")
    check_schema(dataset.schema, WORD_STATS_SCHEMA, f"word stats in {stats_dir}")
    return dataset


def iter_word_stats(dataset: Any, batch_rows: int = STATS_BATCH_ROWS) -> Iterator[list[dict[str, Any]]]:
    """The rows of a `word_stats_dataset`, in lists of at most `batch_rows`: one batch in memory at a time."""
    # No read-ahead: memory holds one row group, whatever the number of files.
    for batch in dataset.to_batches(batch_size=batch_rows, batch_readahead=0, fragment_readahead=0):
        yield batch.to_pylist()


def _format_frequency(value: float) -> str:
    return "0 (unseen)" if value == 0 else f"{value:.3g}"


def seed_provenance(ranking: SeedRanking, tf_icf_ranks: dict[str, int], contrast: str,
                    total_words: int) -> list[dict]:
    """The seeds' rows with what the report and seeds.json say about each: its rank, domain
    frequency (tf / total_words), score, rank by TF-ICF alone (`tf_icf_ranks`) and which contrast
    put it there (`background + general` when it is also among the top K by TF-ICF alone)."""
    score_name = SCORE_COLUMN[contrast]
    rows = []
    for rank, row in enumerate(ranking.seeds, start=1):
        tf_icf_rank = tf_icf_ranks[row["word"]]
        if contrast == "general":
            by = "general"
        else:
            by = "background + general" if tf_icf_rank <= ranking.top_k else "background"
        rows.append({**row, "rank": rank, "domain_frequency": row["tf"] / max(total_words, 1),
                     "score_name": score_name, "score": row[score_name], "tf_icf_rank": tf_icf_rank,
                     "put_there_by": by})
    return rows


def seeds_document(ranking: SeedRanking, tf_icf_ranks: dict[str, int], contrast: str, config: dict[str, Any],
                   total_words: int, formulas: dict[str, str], source_fingerprint: dict[str, Any]) -> dict[str, Any]:
    """seeds.json: the seeds with their provenance, the settings that chose them (`config`, the
    statistics' own settings in its "stats_config"), the formulas and the corpus's fingerprint.
    `maskstream seeds` and `maskstream update` both write this document."""
    return {"seeds": seed_provenance(ranking, tf_icf_ranks, contrast, total_words), "config": config,
            "formulas": formulas, "source_fingerprint": source_fingerprint}


def write_seeds_json(url: str, document: dict[str, Any]) -> None:
    with fsspec.open(url, "w", encoding="utf-8") as f:
        f.write(json.dumps(document, indent=2) + "\n")


def render_report(ranking: SeedRanking, summary: dict[str, Any], config: dict[str, Any], chart_name: str,
                  tf_icf_ranks: dict[str, int]) -> str:
    """The Markdown report; `tf_icf_ranks`: each seed's rank by TF-ICF alone (`SeedRanking.tf_icf_ranks`)."""
    if config.get("contrast") == "background":
        return render_background_report(ranking, tf_icf_ranks, summary, config, chart_name)
    seeds = ranking.seeds
    seed_rank = {row["word"]: i for i, row in enumerate(seeds, start=1)}
    lines = [
        "# Seed words",
        "",
        f"{len(seeds)} seeds from `{config['stats']}`: {summary.get('documents_accepted')} documents "
        f"({summary.get('documents_rejected')} rejected), {summary.get('distinct_words')} distinct words, "
        f"{summary.get('total_words')} words; general frequencies from {summary.get('general_source')}.",
        "",
        f"Filters: df >= {config['min_df']}, stop words: {config['stop_words']}, "
        f"{'alphabetic only' if config['alphabetic_only'] else 'digits allowed'}, "
        f"length >= {config['min_length']}. Score: TF-ICF ({summary.get('formulas', {}).get('tf_icf')}).",
        "",
        f"![seed scores]({chart_name})",
        "",
        "## Seeds",
        "",
        ", ".join(f"`{row['word']}`" for row in seeds),
        "",
        f"## Top {REPORT_CANDIDATES} words by TF-ICF",
        "",
        "| rank | word | tf | df | general frequency | TF-ICF | outcome |",
        "| ---: | --- | ---: | ---: | ---: | ---: | --- |",
    ]
    for rank, (row, reasons) in enumerate(ranking.candidates, start=1):
        outcome = f"seed {seed_rank[row['word']]}" if row["word"] in seed_rank else (
            "removed: " + ", ".join(reasons) if reasons else "not needed (top-K full)")
        lines.append(f"| {rank} | {row['word']} | {row['tf']} | {row['df']} | "
                     f"{_format_frequency(row['general_frequency'])} | {row['tf_icf']:.5f} | {outcome} |")
    lines += ["", "## Words each filter removes (all words; a word may fail several)", "",
              "| filter | words |", "| --- | ---: |"]
    lines += [f"| {reason} | {count} |" for reason, count in sorted(ranking.removed.items())]
    return "\n".join(lines) + "\n"


def render_background_report(ranking: SeedRanking, tf_icf_ranks: dict[str, int], summary: dict[str, Any],
                             config: dict[str, Any], chart_name: str) -> str:
    total, background = summary.get("total_words") or 1, summary.get("background", {})
    seeds = ranking.seeds
    # Each seed's rank by TF-ICF alone, and the top K by TF-ICF alone at their ranks.
    general_rank = {**tf_icf_ranks, **{row["word"]: rank for rank, row in enumerate(ranking.by_tf_icf, start=1)}}
    top_k = config["top_k"]
    lines = [
        "# Seed words (background contrast)",
        "",
        f"{len(seeds)} seeds from `{config['stats']}`: {summary.get('documents_accepted')} documents, "
        f"{summary.get('total_words')} words; background "
        f"{' '.join(summary.get('config', {}).get('background_input', []))} ({background.get('documents_accepted')} "
        f"documents, {background.get('total_words')} words); general frequencies from {summary.get('general_source')}.",
        "",
        f"Filters: df >= {config['min_df']}, stop words: {config['stop_words']}, "
        f"{'alphabetic only' if config['alphabetic_only'] else 'digits allowed'}, length >= {config['min_length']}. "
        f"Score: contrast = TF-ICF x max(0, log(domain frequency / background frequency)) "
        f"({summary.get('formulas', {}).get('background_contrast')}).",
        "",
        f"![seed scores]({chart_name})",
        "",
        "## Seeds",
        "",
        "| rank | word | domain frequency | background frequency | general frequency | TF-ICF | contrast | put there by |",
        "| ---: | --- | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for row in seed_provenance(ranking, tf_icf_ranks, "background", total):
        by = f"{row['put_there_by']} (TF-ICF rank {row['tf_icf_rank']})"
        lines.append(f"| {row['rank']} | {row['word']} | {row['domain_frequency']:.3g} | "
                     f"{_format_frequency(row['background_frequency'])} | {_format_frequency(row['general_frequency'])} | "
                     f"{row['tf_icf']:.5f} | {row['contrast']:.5f} | {by} |")
    seed_words = {row["word"] for row in seeds}
    dropped = [row for row in ranking.by_tf_icf if row["word"] not in seed_words]
    lines += ["", f"## Top-{top_k} words by TF-ICF alone that the background contrast drops", "",
              "| word | TF-ICF rank | domain frequency | background frequency | contrast |",
              "| --- | ---: | ---: | ---: | ---: |"]
    lines += [f"| {row['word']} | {general_rank[row['word']]} | {row['tf'] / total:.3g} | "
              f"{_format_frequency(row['background_frequency'])} | {row['contrast']:.5f} |"
              for row in sorted(dropped, key=lambda r: general_rank[r["word"]])]
    return "\n".join(lines) + "\n"


def plot_scores(seeds: list[dict], path: str, score: str = "tf_icf") -> None:
    """A horizontal bar chart of the seeds' TF-ICF, best at the top, written as PNG to `path`."""
    # heavy: matplotlib loads only when a figure is drawn
    import matplotlib

    matplotlib.use("Agg")
    # heavy: matplotlib loads only when a figure is drawn
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 0.3 * len(seeds) + 1.2))
    words = [row["word"] for row in reversed(seeds)]
    ax.barh(words, [row[score] for row in reversed(seeds)], color="#4c72b0")
    ax.set_xlabel({"tf_icf": "TF-ICF", "contrast": "background contrast"}[score])
    ax.set_title(f"Top {len(seeds)} seed words")
    fig.tight_layout()
    with fsspec.open(path, "wb") as f:
        fig.savefig(f, format="png", dpi=100)
    plt.close(fig)


class SeedsError(ValueError):
    """Statistics that cannot give seeds (no background contrast to rank by, no word passes)."""


@dataclasses.dataclass(frozen=True)
class SeedsConfig:
    """Which seeds `write_seeds` picks: how many, by which score, after which filters (the flags of
    `maskstream seeds`, `update` and `watch`); checked on construction."""

    top_k: int = DEFAULT_TOP_K
    min_df: int = DEFAULT_MIN_DF
    min_length: int = DEFAULT_MIN_LENGTH
    stop_words: str = "english"  # english, none, or a file with one word a line
    alphabetic_only: bool = True
    contrast: str | None = None  # general or background; None: background when the stats have one

    def __post_init__(self) -> None:
        if self.top_k < 1 or self.min_df < 1 or self.min_length < 0:
            raise ValueError(f"--top-k and --min-df must be >= 1 and --min-length >= 0, got {self.top_k}, "
                             f"{self.min_df}, {self.min_length}")
        if self.contrast not in (None, *CONTRASTS):
            raise ValueError(f"--contrast must be one of {CONTRASTS}, got {self.contrast!r}")


def write_seeds(stats: str, output: str, config: SeedsConfig) -> dict[str, Any]:
    """Ranks the word statistics in `stats`, writes `output` (seeds.json), the report and the chart
    beside it; returns {"seeds": the seed rows, "paths": the three files, "warning": or None}.
    Raises FileNotFoundError (no statistics) or SeedsError."""

    word_stats = word_stats_dataset(stats)
    with fsspec.open(posixpath.join(stats.rstrip("/"), "summary.json"), "r", encoding="utf-8") as f:
        summary = json.load(f)
    stop_words = load_stop_words(config.stop_words)
    has_background = "contrast" in word_stats.schema.names
    contrast = config.contrast or ("background" if has_background else "general")
    if contrast == "background" and not has_background:
        raise SeedsError(f"{stats} has no background contrast: run `maskstream stats` with --background-input")
    recorded = {"stats": stats, "top_k": config.top_k, "min_df": config.min_df, "min_length": config.min_length,
                "stop_words": config.stop_words, "alphabetic_only": config.alphabetic_only, "contrast": contrast,
                "stats_config": summary.get("config", {})}
    ranking = SeedRanking(config.top_k, SCORE_COLUMN[contrast], min_df=config.min_df, min_length=config.min_length,
                          stop_words=stop_words, alphabetic_only=config.alphabetic_only)
    for rows in iter_word_stats(word_stats):
        ranking.add(rows)
    seeds = ranking.seeds
    if not seeds:
        raise SeedsError(f"no word of {ranking.words} passes the filters")
    # The formulas the statistics were computed with, plus this version's for the rest.
    formulas = {**FORMULA_VERSIONS, **summary.get("formulas", {})}
    # Ranked by TF-ICF, the seeds' own positions are their TF-ICF ranks; else a second pass counts them.
    tf_icf_ranks = (ranking.tf_icf_ranks(iter_word_stats(word_stats)) if contrast == "background"
                    else {row["word"]: rank for rank, row in enumerate(seeds, start=1)})
    result = seeds_document(ranking, tf_icf_ranks, contrast, recorded, summary.get("total_words") or 0, formulas,
                            summary.get("source_fingerprint", {}))
    stem = output[: -len(".json")] if output.endswith(".json") else output
    report_path, chart_path = f"{stem}_report.md", f"{stem}.png"
    fs, path = fsspec.core.url_to_fs(output)
    fs.makedirs(posixpath.dirname(path) or ".", exist_ok=True)
    plot_scores(seeds, chart_path, SCORE_COLUMN[contrast])
    with fsspec.open(report_path, "w", encoding="utf-8") as f:
        f.write(render_report(ranking, {**summary, "formulas": formulas}, recorded, posixpath.basename(chart_path),
                              tf_icf_ranks))
    write_seeds_json(output, result)
    warning = f"only {len(seeds)} words pass the filters" if len(seeds) < config.top_k else None
    return {"seeds": seeds, "paths": [output, report_path, chart_path], "warning": warning}
