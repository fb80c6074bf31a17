import json

import numpy as np
import pytest
from transformers import AutoTokenizer

from maskstream.mask_signal.words import WORD_PATTERN, word_boundaries, word_spans, words
from maskstream.schemas.manifest import Manifest, ManifestError, ShardEntry, safe_relative_path


def _manifest(**overrides) -> Manifest:
    fields = dict(
        version="v1",
        created_at="2026-01-01T00:00:00Z",
        tokenizer={"name": "t", "vocab_hash": "h", "vocab_size": 10},
        encoder={"name": "e"},
        seeds=["gene"],
        formulas={"tf_icf": "tf-icf-v1"},
        config={},
        source_fingerprint={},
        shards=[ShardEntry(path="shard-00000-of-00001.parquet", rows=3, bytes=100, sha256="ab", tokens=30)],
    )
    fields.update(overrides)
    return Manifest(**fields)


def test_manifest_round_trip_and_totals():
    m = _manifest()
    data = json.loads(m.to_json())
    assert data["totals"] == {"rows": 3, "tokens": 30, "bytes": 100}
    assert Manifest.from_json(m.to_json()) == m


def test_a_manifest_without_the_newer_fields_still_loads():
    data = json.loads(_manifest(vocabulary={"min_word_count": 2}).to_json())
    assert data["vocabulary"] == {"min_word_count": 2}
    for newer in ("vocabulary", "diagnostics"):  # written by later versions of the build
        del data[newer]
    loaded = Manifest.from_json(json.dumps(data))
    assert loaded.vocabulary == {} and loaded.diagnostics == {}


@pytest.mark.parametrize("path", ["../other/shard.parquet", "/etc/passwd", "gs://other-bucket/s.parquet", "a/../../b", ""])
def test_manifest_refuses_paths_outside_the_version(path):
    with pytest.raises(ManifestError):
        safe_relative_path(path)
    text = _manifest(shards=[ShardEntry(path=path or "x", rows=1, bytes=1, sha256="x")]).to_json()
    if path:
        with pytest.raises(ManifestError):
            Manifest.from_json(text)


def test_manifest_refuses_unknown_schema_version():
    data = json.loads(_manifest().to_json())
    data["schema_version"] = 99
    with pytest.raises(ManifestError, match="unknown dataset schema version 99"):
        Manifest.from_json(json.dumps(data))


def test_words_normalize_nfkc_and_lower_case():
    assert words("Ｆｕｌｌwidth DNA-Sequencing_tools, naïve ﬁle 42") == [
        "fullwidth", "dna", "sequencing", "tools", "naïve", "file", "42"
    ]
    text = "Open-source GIS: 3D meshes!"
    assert [text[s:e] for s, e, _ in word_spans(text)] == ["Open", "source", "GIS", "3D", "meshes"]


def test_word_spans_match_bert_pre_tokenizer_on_real_text(sample_corpus, minilm_path):
    """On ASCII text our word boundaries are the BERT pre-tokenizer's, minus punctuation."""
    tokenizer = AutoTokenizer.from_pretrained(minilm_path)
    pre = tokenizer.backend_tokenizer.pre_tokenizer
    checked = 0
    with open(sample_corpus, encoding="utf-8") as f:
        for line in f:
            text = json.loads(line)["text"]
            if not text.isascii():
                continue
            ours = [(s, e) for s, e, _ in word_spans(text)]
            theirs = [span for piece, span in pre.pre_tokenize_str(text) if piece.isalnum()]
            assert ours == theirs
            checked += 1
    assert checked > 1000


def test_word_boundaries_are_the_regex_matches(sample_corpus):
    """The table look-up finds exactly `WORD_PATTERN`'s matches (Python's `re`, not ours), on every
    document of the sample and on text made to break it: combining marks, ligatures, astral
    letters and digits, underscores, other scripts, a lone surrogate, empty text."""
    with open(sample_corpus, encoding="utf-8") as f:
        texts = [json.loads(line)["text"] for line in f]
    texts += [
        "", "_", "a", "e\u0301cole na\u00efve", "\ufb01le \uff26\uff55\u2163 \u00b2\u00bd x\u2082",
        "\U0001d400\U0001d7ce \U0001f600 \u4e2d\u6587\u3002\u0627\u0644\u0639\u0631\u0628\u064a\u0629",
        "snake_case__x9 ", "lone \ud800 surrogate\udfff", "\u0915\u094d\u0937 \u0e01\u0e38 tab\tnew\nline",
        "\n".join(texts[:50]),
    ]
    for text in texts:
        starts, ends = word_boundaries(text)
        assert list(zip(starts.tolist(), ends.tolist(), strict=True)) == [m.span() for m in WORD_PATTERN.finditer(text)]
    assert sum(len(word_boundaries(t)[0]) for t in texts) > 100_000
    assert np.array_equal(word_boundaries("ab, c")[0], [0, 4])
