"""`maskstream inspect --html`: the page's content and size, then the page in a real headless
Chromium (tests/browser.py installs Debian's chromium-headless-shell when none is present): the
token elements and their colours against the probabilities read here from the shards with pyarrow
and matplotlib's viridis, a screenshot, and the search through the URL hash."""

from __future__ import annotations

import json
import re
from collections import Counter
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from maskstream.cli import main
from maskstream.pipelines.dataset.inspect import inspect_html
from maskstream.schemas.manifest import load_manifest
from tests.browser import browser_or_reason, run_browser
from tests.pipelines.test_build import SEEDS, build_args, make_inputs

WINDOW = "--window-size=1280,1000"
PAGE_LIMIT = 5_000_000


@pytest.fixture(scope="module")
def page(sample_corpus, tmp_path_factory, tiny_encoder):
    """A build of 80 documents (words encoded by the tiny encoder: the page shows whatever similarities
    the build wrote) and its page, with the shards' rows by sequence id."""
    folder = tmp_path_factory.mktemp("html")
    inputs = make_inputs(sample_corpus, folder, 80)
    root = str(folder / "dataset")
    assert main(build_args(inputs, root, "--num-shards", "2", "--model", tiny_encoder)) == 0
    path = folder / "report.html"
    assert main(["inspect", root, "--plot", str(folder / "p.png"), "--samples", "1", "--html", str(path),
                 "--html-sequences", "40"]) == 0
    version_url, manifest = load_manifest(root)
    table = pa.concat_tables(pq.read_table(f"{version_url}/{s.path}") for s in manifest.shards)
    rows = {row["sequence_id"]: row for row in table.to_pylist()}
    words = pq.read_table(f"{version_url}/words").to_pylist()
    return {"path": path, "root": root, "manifest": manifest, "rows": rows, "folder": folder,
            "word_of": {w["word_index"]: w["word"] for w in words}}


def page_data(path: Path) -> dict:
    text = path.read_text(encoding="utf-8")
    found = re.search(r'<script type="application/json" id="sequence-data">(.*?)</script>', text, re.S)
    return json.loads(found.group(1))


@pytest.mark.slow
def test_page_is_self_contained_small_and_complete(page, capsys):
    text = page["path"].read_text(encoding="utf-8")
    assert len(text.encode("utf-8")) < PAGE_LIMIT
    # No network: no external script, style sheet, image or font; the plots are data URIs.
    assert not re.search(r'(src|href)="(?!#|data:)', text) and "<link" not in text and "@import" not in text
    assert "url(" not in text and len(re.findall(r'<img src="data:image/png;base64,', text)) == 5  # histogram + 4 maps
    manifest = page["manifest"]
    assert f"all {len(manifest.shards)} shards match" in text and manifest.tokenizer["name"] in text
    for seed in SEEDS:
        assert f"<b>{seed}</b>" in text
    for section in ("browser", "seeds", "signal", "words", "provenance"):
        assert f'id="{section}-section"' in text
    # These seeds.json entries are bare words, as from before `maskstream seeds` recorded provenance.
    assert "not recorded in this version's seeds.json" in text
    data = page_data(page["path"])
    ids = [s["id"] for s in data["sequences"]]
    assert len(ids) == 40 and ids == sorted(set(ids)) and ids[0] == 0 and ids[-1] == manifest.total_rows - 1


@pytest.mark.slow
def test_the_sample_shrinks_until_the_page_fits(page, monkeypatch, capsys):
    limit = page["path"].stat().st_size - 20_000
    monkeypatch.setattr(inspect_html, "MAX_PAGE_BYTES", limit)
    path = page["folder"] / "small.html"
    assert main(["inspect", page["root"], "--plot", str(page["folder"] / "q.png"), "--samples", "1", "--no-verify",
                 "--html", str(path), "--html-sequences", "40"]) == 0
    assert path.stat().st_size <= limit
    shown = len(page_data(path)["sequences"])
    reported = re.search(r"\(([\d,]+) bytes, (\d+) sequences\)", capsys.readouterr().out)
    assert 1 <= shown < 40 and int(reported.group(2)) == shown
    assert int(reported.group(1).replace(",", "")) == path.stat().st_size
    assert "of 40 asked for" in path.read_text(encoding="utf-8")


def test_seed_rows_read_new_and_old_seeds_json():
    new = {"config": {"contrast": "background"}, "seeds": [
        {"word": "astronomy", "tf": 9, "df": 4, "general_frequency": 1e-6, "tf_icf": 0.2, "background_frequency": 0.0,
         "contrast": 0.5, "rank": 1, "domain_frequency": 0.01, "score_name": "contrast", "score": 0.5,
         "tf_icf_rank": 31, "put_there_by": "background"}]}
    (row,) = inspect_html.seed_rows(new, ["astronomy"])
    assert (row["score"], row["put_there_by"], row["tf_icf_rank"], row["domain_frequency"]) == (0.5, "background", 31,
                                                                                                  0.01)
    old_background = {"config": {"contrast": "background"}, "seeds": [
        {"word": "astronomy", "tf": 9, "df": 4, "general_frequency": 1e-6, "tf_icf": 0.2, "background_frequency": 0.0,
         "contrast": 0.5}]}
    (row,) = inspect_html.seed_rows(old_background, ["astronomy"])
    assert row["score"] == 0.5 and row["score_name"] == "contrast" and row["put_there_by"] is None
    old_general = {"config": {}, "seeds": [{"word": "astronomy", "tf": 9, "df": 4, "general_frequency": 1e-6,
                                            "tf_icf": 0.2}]}
    (row,) = inspect_html.seed_rows(old_general, ["astronomy"])
    assert row["score"] == 0.2 and row["put_there_by"] == "general" and row["domain_frequency"] is None
    assert inspect_html.seed_rows(None, ["a", "b"]) == [{"rank": 1, "word": "a"}, {"rank": 2, "word": "b"}]
    assert html_cells(inspect_html.seeds_section(inspect_html.seed_rows(old_background, ["astronomy"])))[-1] == "—"


def test_text_in_the_data_cannot_end_its_script_element():
    from types import SimpleNamespace

    hostile = "</script><!--<script>alert(1)</script>"
    data = {"words": [[hostile, "seed", 0.5]], "sequences": [{"id": 0, "doc": hostile, "t": [hostile], "p": [0.5],
                                                            "g": [0], "w": [0]}],
            "vmax": 1.0, "stops": [[0, 0, 0], [255, 255, 255]], "page_sizes": [10], "page_size": 10, "requested": 1,
            "total": 1}
    manifest = SimpleNamespace(version="v1", total_rows=1, seeds=["seed"])
    text = inspect_html.render(manifest, "root/v1", data, dict.fromkeys(("seeds", "signal", "words", "provenance"), ""))
    script = re.search(r'<script type="application/json" id="sequence-data">(.*?)</script>', text, re.S).group(1)
    assert "<" not in script and json.loads(script) == data


def html_cells(fragment: str) -> list[str]:
    return re.findall(r"<td[^>]*>(.*?)</td>", fragment)


def test_without_a_browser_or_apt_get_the_reason_says_so(monkeypatch):
    import tests.browser

    monkeypatch.setattr(tests.browser.shutil, "which", lambda name: None)
    assert browser_or_reason() == (None, "no browser on the PATH and no apt-get to install chromium-headless-shell")


# --- in the browser ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def browser() -> str:
    path, reason = browser_or_reason()
    if path is None:
        pytest.skip(f"no headless browser: {reason}")
    return path


class PageDom(HTMLParser):
    """The sequences, token elements and status line of a dumped DOM."""

    def __init__(self, text: str):
        super().__init__()
        self.sequences: list[dict] = []
        self.status = ""
        self._in_token = self._in_status = False
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        classes = (attrs.get("class") or "").split()
        if "seq" in classes:
            self.sequences.append({"id": int(attrs["data-sequence-id"]), "tokens": []})
        elif "tok" in classes and self.sequences and "data-p" in attrs:
            self.sequences[-1]["tokens"].append({"p": float(attrs["data-p"]), "style": attrs.get("style", ""),
                                                 "classes": classes, "title": attrs.get("title", ""), "text": ""})
            self._in_token = True
        elif attrs.get("id") == "status":
            self._in_status = True

    def handle_endtag(self, tag):
        self._in_token = self._in_status = False

    def handle_data(self, data):
        if self._in_token:
            self.sequences[-1]["tokens"][-1]["text"] += data
        elif self._in_status:
            self.status += data


def dump_dom(browser: str, path: Path, profile: Path, fragment: str = "") -> str:
    return run_browser(browser, profile, WINDOW, "--dump-dom", path.as_uri() + fragment).stdout


def rgb_of(style: str, prop: str) -> tuple[int, int, int]:
    found = re.search(prop + r":\s*rgb\((\d+),\s*(\d+),\s*(\d+)\)", style)
    return tuple(int(v) for v in found.groups())


def viridis(p: float, vmax: float) -> np.ndarray:
    from matplotlib import colormaps

    return np.asarray(colormaps["viridis"](min(p / vmax, 1.0))[:3]) * 255


def relative_luminance(rgb) -> float:
    c = np.asarray(rgb, np.float64) / 255
    c = np.where(c <= 0.04045, c / 12.92, ((c + 0.055) / 1.055) ** 2.4)
    return float(0.2126 * c[0] + 0.7152 * c[1] + 0.0722 * c[2])


@pytest.mark.slow  # the first one installs the browser on a fresh machine
def test_browser_colours_every_token_by_its_stored_probability(page, browser, tmp_path):
    dom = PageDom(dump_dom(browser, page["path"], tmp_path / "profile"))
    rows = page["rows"]
    data = page_data(page["path"])
    assert [s["id"] for s in dom.sequences] == [s["id"] for s in data["sequences"][: data["page_size"]]]
    stored = [rows[s["id"]] for s in dom.sequences]
    assert sum(len(s["tokens"]) for s in dom.sequences) == sum(len(r["input_ids"]) for r in stored)
    # The scale's top is the largest stored probability of the version.
    vmax = max(max(r["mask_probability"]) for r in rows.values())
    assert data["vmax"] == pytest.approx(vmax, rel=1e-6)
    checked = Counter()
    for sequence, row in zip(dom.sequences, stored, strict=True):
        for token, p, special, index in zip(sequence["tokens"], row["mask_probability"], row["special_tokens_mask"],
                                            row["word_index"], strict=True):
            assert token["p"] == pytest.approx(p, abs=5e-5)
            if special:
                assert "special" in token["classes"] and "never masked" in token["title"]
                checked["special"] += 1
                continue
            background = rgb_of(token["style"], "background-color")
            assert np.abs(np.asarray(background) - viridis(p, vmax)).max() <= 3, (p, background)
            # Text contrast: black on light cells, white on dark ones, WCAG ratio at least 4.5.
            text = (0, 0, 0) if re.search(r"color:\s*#000", token["style"].split(";")[1]) else (255, 255, 255)
            light, dark = sorted([relative_luminance(background), relative_luminance(text)], reverse=True)
            assert (light + 0.05) / (dark + 0.05) >= 4.5
            if index >= 0:
                assert f"word: {page['word_of'][index]} |" in token["title"] and "nearest seed: " in token["title"]
            checked["coloured"] += 1
    assert checked["coloured"] > 300 and checked["special"] >= 2 * len(dom.sequences)


RECTS_SCRIPT = """<script>
const rects = [...document.querySelectorAll('.tok:not(.special)')].map(t => {
  const r = t.getBoundingClientRect();
  return [r.left, r.top, r.width, r.height, parseFloat(t.dataset.p)];
});
const out = document.createElement('pre'); out.id = 'rects'; out.textContent = JSON.stringify(rects);
document.body.appendChild(out);
</script>"""


@pytest.mark.slow
def test_screenshot_shows_tinted_cells_where_the_likely_tokens_are(page, browser, tmp_path):
    from PIL import Image

    shot = tmp_path / "shot.png"
    run_browser(browser, tmp_path / "p1", WINDOW, f"--screenshot={shot}", page["path"].as_uri())
    image = np.asarray(Image.open(shot).convert("RGB")).astype(np.float64)
    assert image.shape[:2] == (1000, 1280) and image.std() > 20  # not blank
    # Where the tokens are: the same page with a script appended that records their boxes.
    probe = tmp_path / "probe.html"
    probe.write_text(page["path"].read_text(encoding="utf-8").replace("</body>", RECTS_SCRIPT + "</body>"),
                     encoding="utf-8")
    dom = dump_dom(browser, probe, tmp_path / "p2")
    rects = json.loads(re.search(r'<pre id="rects">(.*?)</pre>', dom, re.S).group(1))
    vmax = page_data(page["path"])["vmax"]
    visible = [r for r in rects if r[1] >= 0 and r[1] + r[3] < 1000 and r[2] >= 6]
    assert len(visible) > 50
    by_probability = sorted(visible, key=lambda r: r[4])
    for left, top, width, height, p in by_probability[-5:] + by_probability[:5]:
        cell = image[int(top) + 1:int(top + height) - 1, int(left) + 2:int(left + width) - 1].reshape(-1, 3)
        colours, counts = np.unique(cell.round(), axis=0, return_counts=True)
        background = colours[counts.argmax()]  # the cell's most common colour: its background, not the glyphs
        assert np.abs(background - viridis(p, vmax)).max() <= 6, (p, background)
    assert by_probability[-1][4] > 2 * by_probability[0][4]


@pytest.mark.slow
def test_url_hash_word_filters_the_sequences(page, browser, tmp_path):
    data = page_data(page["path"])
    rows, word_of = page["rows"], page["word_of"]
    contains = Counter(w for s in data["sequences"] for w in {word_of[i] for i in rows[s["id"]]["word_index"] if i >= 0})
    word = next(w for w, n in sorted(contains.items()) if 2 <= n <= len(data["sequences"]) // 2 and w.isalpha())
    expected = [s["id"] for s in data["sequences"]
                if word in {word_of[i] for i in rows[s["id"]]["word_index"] if i >= 0}]
    dom = PageDom(dump_dom(browser, page["path"], tmp_path / "p1", f"#word={word.upper()}&per=100"))
    assert [s["id"] for s in dom.sequences] == expected
    assert f"{len(expected)} of the {len(data['sequences'])} sequences contain \"{word}\"" in dom.status
    for sequence in dom.sequences:
        hits = [t for t in sequence["tokens"] if "hit" in t["classes"]]
        indices = rows[sequence["id"]]["word_index"]
        assert len(hits) == sum(1 for i in indices if i >= 0 and word_of[i] == word)
    # Next/previous: page 2 of 10 a page holds the next ten of the sample.
    dom = PageDom(dump_dom(browser, page["path"], tmp_path / "p2", "#page=2&per=10"))
    assert [s["id"] for s in dom.sequences] == [s["id"] for s in data["sequences"][10:20]]
    dom = PageDom(dump_dom(browser, page["path"], tmp_path / "p3", "#word=nosuchwordanywhere"))
    assert dom.sequences == [] and "no sequence of the 40 contains" in dom.status
