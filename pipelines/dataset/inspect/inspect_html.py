"""`maskstream inspect DATASET --html PAGE`: one self-contained HTML page of a dataset version.

The page needs no network: CSS, JavaScript, data and plots (PNG as data URIs) are inline. It holds
a sequence browser (every token's background coloured by its stored mask probability on viridis, a
colour-blind-safe scale, with a legend; word boundaries visible; hover for the word, nearest seed,
similarity and probability; a box, or the URL hash `#word=WORD`, finds the sequences containing a
word; next/previous through a sample of `--html-sequences` sequences spread evenly over the
version), the seeds table of the version's seeds.json, the signal diagnostics of the built map and
the paper, rank and sharpened maps side by side with their plots, the most and least masked frequent
words, and the version's provenance. The sample shrinks until the page fits `MAX_PAGE_BYTES`,
whatever the corpus size.
"""

from __future__ import annotations

import base64
import html
import json
import os
import tempfile
from typing import Any

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from maskstream.pipelines.dataset.core.vocabulary import vocabulary_line
from maskstream.pipelines.dataset.inspect.signal import GROUP_LABELS, plot_histograms, plot_report
from maskstream.pipelines.dataset.storage.dataset_writer import join
from maskstream.pipelines.statistics.seeds import SCORE_COLUMN
from maskstream.schemas.manifest import SEEDS_NAME

DEFAULT_SEQUENCES = 200
# The bound is 5 MB; the margin leaves room for the parts measured after the sample is cut.
MAX_PAGE_BYTES = 4_800_000
# Its text (at least one character and two quotes), probability, word occurrence and word, each with a comma.
MIN_TOKEN_BYTES = 8
PAGE_SIZES = (5, 10, 20, 50, 100)
DEFAULT_PAGE_SIZE = 10
SCALE_STOPS = 33  # viridis sampled at 33 points, interpolated linearly by the page's script
SEQUENCE_COLUMNS = ["sequence_id", "document_id", "input_ids", "word_ids", "word_index", "special_tokens_mask",
                    "mask_probability"]


def sample_ids(total: int, count: int) -> np.ndarray:
    """`count` sequence ids spread evenly over 0..total-1, first and last included."""
    if total <= 0 or count <= 0:
        return np.zeros(0, np.int64)
    return np.unique(np.linspace(0, total - 1, min(count, total)).round().astype(np.int64))


def read_sample(version_url: str, manifest: Any, ids: np.ndarray) -> list[dict[str, Any]]:
    """The SEQUENCE_SCHEMA rows of `ids`, in id order, read shard by shard."""
    wanted = pa.array(ids)
    rows: list[dict[str, Any]] = []
    for shard in manifest.shards:
        with fsspec.open(join(version_url, shard.path), "rb") as f:
            # The filter skips the row groups whose sequence_id range holds none of the sample.
            table = pq.read_table(f, columns=SEQUENCE_COLUMNS, filters=pc.field("sequence_id").isin(wanted))
        rows.extend(table.to_pylist())
    return sorted(rows, key=lambda row: row["sequence_id"])


def token_texts(tokenizer: Any, ids: list[int], cache: dict[int, str]) -> list[str]:
    """What each token spells, without the tokenizer's word markers (`##`, `Ġ`, `▁`); `cache`
    holds the ids already spelled."""
    for token_id in set(ids) - cache.keys():
        token = tokenizer.convert_ids_to_tokens(token_id)
        cache[token_id] = tokenizer.convert_tokens_to_string([token]).strip().removeprefix("##") or token
    return [cache[i] for i in ids]


def viridis_stops(count: int = SCALE_STOPS) -> list[list[int]]:
    # heavy: matplotlib loads only when a figure is drawn
    from matplotlib import colormaps

    colours = colormaps["viridis"](np.linspace(0.0, 1.0, count))[:, :3]
    return (colours * 255).round().astype(int).tolist()


def sequence_data(rows: list[dict[str, Any]], tokenizer: Any, word_table: Any) -> dict[str, Any]:
    """The browser's data: the words the sample uses (word, nearest seed, similarity) and per
    sequence its tokens' texts, probabilities (4 decimals), word occurrence (-1: special token)
    and word (an index into `words`, -1: outside any word)."""
    used = sorted({i for row in rows for i in row["word_index"] if i >= 0})
    local = {index: n for n, index in enumerate(used)}
    word = np.empty(word_table.num_rows, object)
    nearest = np.empty(word_table.num_rows, object)
    similarity = np.zeros(word_table.num_rows, np.float64)
    index = word_table.column("word_index").to_numpy()
    word[index] = word_table.column("word").to_pylist()
    nearest[index] = word_table.column("nearest_seed").to_pylist()
    similarity[index] = word_table.column("similarity").to_numpy()
    sequences, spelled = [], {}
    for row in rows:
        special = row["special_tokens_mask"]
        sequences.append({
            "id": row["sequence_id"],
            "doc": row["document_id"],
            "t": token_texts(tokenizer, row["input_ids"], spelled),
            "p": [round(float(p), 4) for p in row["mask_probability"]],
            "g": [-1 if s else g for g, s in zip(row["word_ids"], special, strict=True)],
            "w": [local[i] if i >= 0 else -1 for i in row["word_index"]],
        })
    words = [[word[i], nearest[i], round(float(similarity[i]), 4)] for i in used]
    return {"words": words, "sequences": sequences}


def image_data_uri(draw: Any) -> str:
    """A PNG data URI of what `draw(path)` writes."""
    handle, path = tempfile.mkstemp(suffix=".png")
    os.close(handle)
    try:
        draw(path)
        with open(path, "rb") as f:
            return "data:image/png;base64," + base64.b64encode(f.read()).decode("ascii")
    finally:
        os.unlink(path)


def _cell(value: Any, digits: str = ".3g") -> str:
    if value is None or value == "":
        return "—"
    if isinstance(value, float):
        return "0 (unseen)" if value == 0 and digits == ".3g" else format(value, digits)
    return html.escape(str(value))


def seed_rows(seeds_json: dict[str, Any] | None, manifest_seeds: list[str]) -> list[dict[str, Any]]:
    """One row per seed: what seeds.json says (rank, frequencies, score, which contrast put it
    there), None where a file written before those fields existed, or a bare list, has nothing."""

    if not seeds_json:
        return [{"rank": rank, "word": w} for rank, w in enumerate(manifest_seeds, start=1)]
    contrast = (seeds_json.get("config") or {}).get("contrast", "general")
    rows = []
    for rank, entry in enumerate(seeds_json.get("seeds", []), start=1):
        score_name = entry.get("score_name", SCORE_COLUMN.get(contrast, "tf_icf"))
        by = entry.get("put_there_by")
        if by is None and contrast == "general" and "tf_icf" in entry:
            by = "general"  # without a background, TF-ICF alone ranks the seeds
        rows.append({"rank": entry.get("rank", rank), "word": entry["word"],
                     "domain_frequency": entry.get("domain_frequency"), "tf": entry.get("tf"),
                     "background_frequency": entry.get("background_frequency"),
                     "general_frequency": entry.get("general_frequency"),
                     "score_name": score_name, "score": entry.get("score", entry.get(score_name)),
                     "tf_icf_rank": entry.get("tf_icf_rank"), "put_there_by": by})
    return rows


def read_seeds_json(version_url: str) -> dict[str, Any] | None:

    try:
        with fsspec.open(join(version_url, SEEDS_NAME), "r", encoding="utf-8") as f:
            return json.load(f)
    except (FileNotFoundError, ValueError):
        return None


def _table(header: list[str], rows: list[list[str]], numeric_from: int = 1) -> str:
    head = "".join(f'<th{" class=num" if i >= numeric_from else ""}>{html.escape(h)}</th>'
                   for i, h in enumerate(header))
    body = "".join("<tr>" + "".join(f'<td{" class=num" if i >= numeric_from else ""}>{c}</td>'
                                    for i, c in enumerate(row)) + "</tr>" for row in rows)
    return f'<div class="scroll"><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'


def provenance_section(version_url: str, manifest: Any, verified: bool) -> str:
    docs = manifest.source_fingerprint.get("documents", {})
    tokenizer, encoder = manifest.tokenizer, manifest.encoder
    checksums = (f"all {len(manifest.shards)} shards match the manifest's sha256" if verified
                 else "not checked (--no-verify)")
    facts = [
        ("version", version_url),
        ("created", f"{manifest.created_at} (schema {manifest.schema_version})"),
        ("checksums", checksums),
        ("documents", f"read {docs.get('read', '?')}, accepted {docs.get('accepted', '?')}, "
                      f"rejected {docs.get('rejected', '?')}"),
        ("sequences", f"{manifest.total_rows:,} in {len(manifest.shards)} shards, {manifest.total_tokens:,} tokens, "
                      f"{manifest.total_bytes:,} bytes"),
        ("tokenizer", f"{tokenizer.get('name')} ({tokenizer.get('class', '?')}, vocab {tokenizer.get('vocab_size')}, "
                      f"hash {str(tokenizer.get('vocab_hash'))[:12]})"),
        ("encoder", f"{encoder.get('name')} ({encoder.get('pooling', '?')} pooling, "
                    f"{encoder.get('dtype', 'float32')})"),
        ("corpus fingerprint", str(manifest.source_fingerprint.get("sha256", "?"))),
        ("vocabulary", vocabulary_line(manifest.vocabulary) or "every word type encoded"),
        ("formulas", ", ".join(f"{k}={v}" for k, v in sorted(manifest.formulas.items()))),
    ]
    config = [[html.escape(k), html.escape(json.dumps(v) if not isinstance(v, str) else v)]
              for k, v in sorted(manifest.config.items())]
    return ("<dl class=facts>" + "".join(f"<dt>{html.escape(k)}</dt><dd>{html.escape(v)}</dd>" for k, v in facts)
            + "</dl><h3>Configuration</h3>" + _table(["key", "value"], config, numeric_from=2))


def seeds_section(rows: list[dict[str, Any]]) -> str:
    score_names = {r.get("score_name") for r in rows if r.get("score_name")}
    score_label = {"tf_icf": "TF-ICF", "contrast": "background contrast"}.get(next(iter(score_names), ""), "score")
    body = [[_cell(r["rank"]), f"<b>{html.escape(r['word'])}</b>", _cell(r.get("domain_frequency")),
             _cell(r.get("background_frequency")), _cell(r.get("general_frequency")),
             _cell(r.get("score"), ".5f"), _cell(r.get("tf_icf_rank")), _cell(r.get("put_there_by"))]
            for r in rows]
    note = ("<p class=note>— : not recorded in this version's seeds.json (written before `maskstream seeds` "
            "recorded it, or by hand).</p>" if any(r.get("put_there_by") is None for r in rows) else "")
    return _table(["rank", "word", "domain frequency", "background frequency", "general frequency", score_label,
                   "TF-ICF rank", "put there by"], body, numeric_from=2) + note


def signal_section(reports: dict[str, dict[str, Any]], histogram_uri: str, plot_uris: dict[str, str]) -> str:
    built_name, built = next(iter(reports.items()))
    rows = []
    for name, report in reports.items():
        groups = report["groups"]
        rows.append([html.escape(name) + (" <small>(stored)</small>" if name == built_name else ""),
                     *(f"{groups[k]['lift']:.2f}" for k in GROUP_LABELS),
                     f"{report['entropy_ratio']:.3f}", f"{report.get('max_budget_error', float('nan')):.1e}"])
    warning = (f'<p class=warning role=alert>{html.escape(built["warning"])}</p>' if built.get("warning") else "")
    plots = "".join(f'<figure><img src="{uri}" alt="signal plot of {html.escape(name)}"><figcaption>'
                    f"{html.escape(name)}</figcaption></figure>" for name, uri in plot_uris.items())
    return (f"<p>{built['tokens']:,} non-special tokens, {built['expected_masks']:,.1f} expected masks. Lift: share "
            "of the expected masks over share of the tokens (1 is uniform masking); entropy: of the expected masks, "
            "relative to uniform (1 is uniform).</p>" + warning
            + _table(["map", *(f"{label} lift" for label in GROUP_LABELS.values()), "entropy", "budget error"], rows)
            + f'<figure class=wide><img src="{histogram_uri}" alt="histograms of the mask probabilities and of the '
              'expected masked fraction per sequence"><figcaption>stored mask probabilities</figcaption></figure>'
            + f"<h3>The maps side by side</h3><div class=grid>{plots}</div>")


def words_section(report: dict[str, Any], vmax: float, stops: list[list[int]]) -> str:
    def swatch(p: float) -> str:
        x = min(max(p / vmax, 0.0), 1.0) * (len(stops) - 1)
        i = min(int(x), len(stops) - 2)
        r, g, b = (round(stops[i][c] + (stops[i + 1][c] - stops[i][c]) * (x - i)) for c in range(3))
        return f'<span class=swatch style="background-color:rgb({r},{g},{b})"></span>'

    def rows(entries):
        return [[f"<b>{html.escape(e['word'])}</b>", f"{e['tokens']:,}", f"{e['expected_masks']:,.1f}",
                 f"{swatch(e['mean_probability'])}{e['mean_probability']:.4f}", f"{e['similarity']:.3f}"]
                for e in entries]

    header = ["word", "tokens", "expected masks", "mean probability", "similarity to nearest seed"]
    return ("<div class=pair><div><h3>Most masked words</h3>" + _table(header, rows(report["most_masked"]))
            + "</div><div><h3>Frequent words masked least</h3>"
            + _table(header, rows(report["frequent_least_masked"])) + "</div></div>")


def peers_section(rows: dict[str, list[list[Any]]] | None) -> str:
    """The peer signals' tables (`peer_signal_rows`); '' for a version without them."""
    if rows is None:
        return ""
    escaped = {name: [[html.escape(str(cell)) for cell in row] for row in table] for name, table in rows.items()}
    return ("<p>PMI-Masking masks these collocations as one unit (<code>pmi_span</code>); InforMask weighs each "
            "word by its informative relevance (<code>informask</code>).</p>"
            + _table(["top collocation", "PMI", "count"], escaped["collocations"])
            + _table(["collocation found in the sequences", "times"], escaped["found"])
            + _table(["most informative word", "relevance", "sentences"], escaped["informative"])
            + _table(["least informative word", "relevance", "sentences"], escaped["uninformative"]))


def write_page(path: str, version_url: str, manifest: Any, *, tokenizer: Any, word_table: Any,
               reports: dict[str, dict[str, Any]], probabilities: np.ndarray, rates: list[float],
               verified: bool, sequences: int = DEFAULT_SEQUENCES,
               peer_rows: dict[str, list[list[Any]]] | None = None) -> dict[str, Any]:
    """Writes the page to `path` (local or remote); returns {"bytes", "sequences", "requested"}.
    `peer_rows`: the peer signals' tables (pipelines/dataset/inspect/peer_summary.py), when the version has them."""
    if sequences < 1:
        raise ValueError(f"--html-sequences must be at least 1, not {sequences}")
    built_name, built = next(iter(reports.items()))
    histogram_uri = image_data_uri(lambda p: plot_histograms(
        probabilities, rates, p, f"{manifest.version}: {manifest.total_rows} sequences"))
    plot_uris = {name: image_data_uri(lambda p, r=report, n=name: plot_report(r, p, n))
                 for name, report in reports.items()}
    # The scale's top is the version's largest probability (1.0 for a version without any).
    vmax = float(probabilities.max()) if len(probabilities) and probabilities.max() > 0 else 1.0
    stops = viridis_stops()
    seeds = seed_rows(read_seeds_json(version_url), manifest.seeds)
    sections = {
        "seeds": seeds_section(seeds),
        "signal": signal_section(reports, histogram_uri, plot_uris),
        "words": words_section(built, vmax, stops),
        "provenance": provenance_section(version_url, manifest, verified),
        "peers": peers_section(peer_rows),
    }
    requested = min(sequences, manifest.total_rows)
    # A token takes at least MIN_TOKEN_BYTES of the page's data, so a larger sample cannot fit: cap it
    # before reading, then halve it until the page fits.
    mean_tokens = manifest.total_tokens / max(manifest.total_rows, 1)
    fits = max(1, int(MAX_PAGE_BYTES / (MIN_TOKEN_BYTES * max(mean_tokens, 1))))
    rows = read_sample(version_url, manifest, sample_ids(manifest.total_rows, min(sequences, fits)))
    while True:  # the sample is the only part that grows with the corpus: halve it until the page fits
        data = {**sequence_data(rows, tokenizer, word_table), "vmax": vmax, "stops": stops,
                "page_sizes": list(PAGE_SIZES), "page_size": DEFAULT_PAGE_SIZE, "requested": requested,
                "total": manifest.total_rows}
        page = render(manifest, version_url, data, sections).encode("utf-8")
        if len(page) <= MAX_PAGE_BYTES or len(rows) <= 1:
            break
        rows = rows[:: 2]
    with fsspec.open(path, "wb") as f:
        f.write(page)
    return {"bytes": len(page), "sequences": len(rows), "requested": requested}


def render(manifest: Any, version_url: str, data: dict[str, Any], sections: dict[str, str]) -> str:
    # No `<` in the script element: `</script>` or `<!--` inside the data would end or alter it.
    payload = json.dumps(data, ensure_ascii=False, separators=(",", ":")).replace("<", "\\u003c")
    title = f"maskstream: {manifest.version}"
    shown = len(data["sequences"])
    cut = (f" (of {data['requested']:,} asked for: the page stays under {MAX_PAGE_BYTES / 1e6:g} MB)"
           if shown < data["requested"] else "")
    legend_ticks = "".join(f"<span>{data['vmax'] * q:.3g}</span>" for q in (0, 0.25, 0.5, 0.75, 1))
    gradient = ", ".join(f"rgb({r},{g},{b})" for r, g, b in data["stops"])
    nav = "".join(f'<a href="#{key}-section">{label}</a>' for key, label in (
        ("browser", "Sequences"), ("seeds", "Seeds"), ("signal", "Signal"), ("words", "Words"),
        *((("peers", "Peer signals"),) if sections.get("peers") else ()), ("provenance", "Provenance")))
    peers = (f'<section id="peers-section"><h2>Peer signals: collocations and informativeness</h2>'
             f'{sections["peers"]}</section>\n' if sections.get("peers") else "")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{html.escape(title)}</title>
<style>{CSS}</style></head>
<body>
<header><h1>{html.escape(title)}</h1><nav>{nav}</nav>
<p class=sub>{html.escape(version_url)} · {manifest.total_rows:,} sequences · seeds: {html.escape(", ".join(manifest.seeds))}</p>
</header>
<main>
<section id="browser-section"><h2>Sequences: which tokens will be masked</h2>
<p>{shown:,} sequences spread evenly over the {data['total']:,} of this version{cut}. Each token's background
is its stored mask probability; a gap separates words, a thin line the tokens inside a word. Hover a token for
its word, nearest seed, similarity and probability.</p>
<div class=legend aria-label="colour scale of the mask probability">
<span class=legend-label>mask probability</span>
<div class=legend-scale><div class=legend-bar style="background:linear-gradient(to right, {gradient})"></div>
<div class=legend-ticks>{legend_ticks}</div></div>
<span class="tok special legend-special">[CLS]</span><span class=legend-label>special token, never masked</span>
</div>
<div class=controls>
<label>word <input id=search type=search placeholder="e.g. protein" autocomplete=off></label>
<button id=prev type=button>&larr; previous</button><span id=pageinfo aria-live=polite></span>
<button id=next type=button>next &rarr;</button>
<label>per page <select id=perpage></select></label>
</div>
<p id=status aria-live=polite></p>
<p id=hover class=hover>hover a token</p>
<div id=sequences></div>
</section>
<section id="seeds-section"><h2>Seeds</h2>{sections['seeds']}</section>
<section id="signal-section"><h2>Signal diagnostics</h2>{sections['signal']}</section>
<section id="words-section"><h2>Most and least masked frequent words</h2>{sections['words']}</section>
{peers}<section id="provenance-section"><h2>Provenance</h2>{sections['provenance']}</section>
</main>
<script type="application/json" id="sequence-data">{payload}</script>
<script>{JAVASCRIPT}</script>
</body></html>
"""


CSS = """
:root { font-family: system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif; color: #1a1a1a;
  background: #fff; }
body { margin: 0; }
header { padding: 12px 24px; background: #f3f3f3; border-bottom: 1px solid #ccc; }
header h1 { margin: 0 0 4px; font-size: 1.35rem; }
header nav a { margin-right: 16px; color: #0b4f8a; }
.sub { margin: 4px 0 0; color: #444; font-size: .9rem; overflow-wrap: anywhere; }
main { max-width: 1240px; margin: 0 auto; padding: 0 20px 40px; }
section { margin-top: 28px; }
h2 { font-size: 1.2rem; border-bottom: 2px solid #ddd; padding-bottom: 4px; }
h3 { font-size: 1.02rem; }
.scroll { overflow-x: auto; }
table { border-collapse: collapse; font-size: .88rem; }
th, td { border-bottom: 1px solid #ddd; padding: 3px 10px; text-align: left; vertical-align: top; }
th { background: #f3f3f3; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
.facts { display: grid; grid-template-columns: max-content 1fr; gap: 3px 16px; font-size: .9rem; }
.facts dt { font-weight: 600; } .facts dd { margin: 0; overflow-wrap: anywhere; }
.warning { background: #fff4ce; border-left: 4px solid #8a6d00; padding: 8px 12px; }
.note { color: #444; font-size: .85rem; }
figure { margin: 8px 0; } figure img { width: 100%; height: auto; border: 1px solid #ddd; }
figcaption { font-size: .85rem; color: #444; }
.grid { display: grid; grid-template-columns: repeat(2, minmax(0, 1fr)); gap: 12px; }
.pair { display: grid; grid-template-columns: repeat(2, minmax(0, 1fr)); gap: 20px; }
.legend { display: flex; align-items: center; gap: 10px; flex-wrap: wrap; margin: 8px 0; }
.legend-label { font-size: .85rem; }
.legend-scale { width: 320px; }
.legend-bar { height: 16px; border: 1px solid #888; }
.legend-ticks { display: flex; justify-content: space-between; font-size: .78rem; }
.controls { display: flex; align-items: center; gap: 12px; flex-wrap: wrap; margin: 8px 0; }
.controls input { font-size: 1rem; padding: 3px 6px; width: 14em; }
.controls button, .controls select { font-size: .95rem; padding: 3px 10px; }
.hover { position: sticky; top: 0; background: #fafafa; border: 1px solid #ddd; padding: 4px 8px; margin: 6px 0;
  font-size: .88rem; min-height: 1.3em; z-index: 1; }
.seq { border: 1px solid #ddd; border-radius: 4px; padding: 6px 8px; margin: 8px 0; line-height: 1.9; }
.seq-head { font-size: .8rem; color: #444; margin-bottom: 2px; }
.word { display: inline-flex; margin: 0 .32em 0 0; border-radius: 3px; }
.tok { padding: 1px 2px; font-family: ui-monospace, "DejaVu Sans Mono", monospace; font-size: .9rem;
  cursor: default; }
.word .tok + .tok { border-left: 1px solid #fff; }
.tok.special { background: #fff; color: #595959; border: 1px dashed #767676; }
.tok.hit { outline: 3px solid #d62728; outline-offset: -1px; }
.swatch { display: inline-block; width: .9em; height: .9em; margin-right: 6px; border: 1px solid #888;
  vertical-align: -2px; }
"""

JAVASCRIPT = r"""
(function () {
  const data = JSON.parse(document.getElementById('sequence-data').textContent);
  const stops = data.stops, words = data.words, sequences = data.sequences;
  const box = document.getElementById('sequences'), search = document.getElementById('search');
  const status = document.getElementById('status'), pageinfo = document.getElementById('pageinfo');
  const perpage = document.getElementById('perpage'), hover = document.getElementById('hover');
  let page = 0, pageSize = data.page_size, query = '';

  // Viridis, linearly between its sampled stops; p / vmax clipped to [0, 1].
  function colour(p) {
    const x = Math.min(Math.max(p / data.vmax, 0), 1) * (stops.length - 1);
    const i = Math.min(Math.floor(x), stops.length - 2), f = x - i;
    return [0, 1, 2].map(c => Math.round(stops[i][c] + (stops[i + 1][c] - stops[i][c]) * f));
  }
  // WCAG relative luminance; the text is black or white, whichever contrasts more.
  function luminance(rgb) {
    const l = rgb.map(v => { v /= 255; return v <= 0.04045 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4); });
    return 0.2126 * l[0] + 0.7152 * l[1] + 0.0722 * l[2];
  }
  function textColour(rgb) {
    const l = luminance(rgb);
    return (l + 0.05) / 0.05 >= 1.05 / (l + 0.05) ? '#000' : '#fff';
  }
  function normalize(text) { return text.normalize('NFKC').toLowerCase().trim(); }
  function containsWord(seq, word) { return seq.w.some(i => i >= 0 && words[i][0] === word); }
  function matching() {
    return query ? sequences.filter(s => containsWord(s, query)) : sequences;
  }
  function tokenTitle(seq, k) {
    const p = seq.p[k].toFixed(4);
    if (seq.g[k] < 0) return 'special token "' + seq.t[k] + '": never masked (probability ' + p + ')';
    if (seq.w[k] < 0) return 'outside any word ("' + seq.t[k] + '"), probability ' + p;
    const [word, nearest, similarity] = words[seq.w[k]];
    const seed = nearest ? nearest : '(not encoded: rarer than --min-word-count, mean similarity used)';
    return 'word: ' + word + ' | nearest seed: ' + seed + ' | similarity: ' + similarity.toFixed(3) +
      ' | mask probability: ' + p;
  }
  function renderSequence(seq) {
    const div = document.createElement('div');
    div.className = 'seq';
    div.dataset.sequenceId = seq.id;
    const head = document.createElement('div');
    head.className = 'seq-head';
    const expected = seq.p.reduce((a, b) => a + b, 0);
    head.textContent = 'sequence ' + seq.id + ' · ' + seq.doc + ' · ' + seq.t.length + ' tokens · expected masked ' +
      expected.toFixed(2);
    div.appendChild(head);
    let group = null, last = null;
    for (let k = 0; k < seq.t.length; k++) {
      if (group === null || seq.g[k] < 0 || seq.g[k] !== last) {
        group = document.createElement('span');
        group.className = 'word';
        div.appendChild(group);
        div.appendChild(document.createTextNode(' '));
      }
      last = seq.g[k];
      const tok = document.createElement('span');
      tok.textContent = seq.t[k];
      tok.dataset.p = seq.p[k];
      tok.title = tokenTitle(seq, k);
      if (seq.g[k] < 0) {
        tok.className = 'tok special';
      } else {
        const rgb = colour(seq.p[k]);
        tok.className = 'tok' + (query && seq.w[k] >= 0 && words[seq.w[k]][0] === query ? ' hit' : '');
        tok.setAttribute('style', 'background-color: rgb(' + rgb.join(', ') + '); color: ' + textColour(rgb));
      }
      group.appendChild(tok);
    }
    return div;
  }
  function render() {
    const found = matching();
    const pages = Math.max(1, Math.ceil(found.length / pageSize));
    page = Math.min(Math.max(page, 0), pages - 1);
    box.replaceChildren(...found.slice(page * pageSize, (page + 1) * pageSize).map(renderSequence));
    status.textContent = query
      ? (found.length ? found.length + ' of the ' + sequences.length + ' sequences contain "' + query + '"'
                      : 'no sequence of the ' + sequences.length + ' contains "' + query + '"')
      : sequences.length + ' sequences';
    pageinfo.textContent = 'page ' + (page + 1) + ' of ' + pages;
    document.getElementById('prev').disabled = page === 0;
    document.getElementById('next').disabled = page >= pages - 1;
  }
  function readHash() {
    const params = new URLSearchParams(location.hash.slice(1));
    query = normalize(params.get('word') || '');
    search.value = query;
    page = Math.max(0, (parseInt(params.get('page') || '1', 10) || 1) - 1);
    const size = parseInt(params.get('per') || '', 10);
    if (size > 0) pageSize = size;
    syncPageSizes();
  }
  function syncPageSizes() {
    const sizes = [...new Set([...data.page_sizes, pageSize])].sort((a, b) => a - b);
    perpage.replaceChildren(...sizes.map(size => {
      const option = document.createElement('option');
      option.value = option.textContent = String(size);
      return option;
    }));
    perpage.value = String(pageSize);
  }
  function writeHash() {
    const params = new URLSearchParams();
    if (query) params.set('word', query);
    if (page) params.set('page', page + 1);
    if (pageSize !== data.page_size) params.set('per', pageSize);
    history.replaceState(null, '', params.toString() ? '#' + params.toString() : location.pathname);
  }
  search.addEventListener('input', () => { query = normalize(search.value); page = 0; writeHash(); render(); });
  perpage.addEventListener('change', () => { pageSize = parseInt(perpage.value, 10); page = 0; writeHash(); render(); });
  document.getElementById('prev').addEventListener('click', () => { page--; writeHash(); render(); });
  document.getElementById('next').addEventListener('click', () => { page++; writeHash(); render(); });
  window.addEventListener('hashchange', () => { readHash(); render(); });
  box.addEventListener('mouseover', e => { if (e.target.classList.contains('tok')) hover.textContent = e.target.title; });
  readHash();
  render();
})();
"""
