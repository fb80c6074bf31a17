"""The default masked LM's pretraining corpus against both tasks `maskstream evaluate` is judged on, by
evaluate's own check (`--general-corpus`: `check_general_corpus`, which refuses a corpus holding a
near-duplicate of any labeled text). The default runs are the user's command and carry no such flag, so the
check runs here, apart, and its output is committed (results/leak_check.json), with a search of the
corpus for the fill-mask test's sentences (fill_mask.json), which the model must never have read.

    python -m benchmarks.english_mlm.leak_check --corpus out/english_mlm/corpus.jsonl.gz
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from benchmarks.english_mlm.pretrain import texts_sha256
from maskstream.evaluate import neardup
from maskstream.evaluate.corpora import read_labeled, read_texts
from maskstream.evaluate.design import EvaluateConfig
from maskstream.evaluate.experiment import check_general_corpus
from maskstream.schemas.manifest import sha256_file

ROOT = Path(__file__).resolve().parents[2]
TASKS = {"shipped": ("data/debian-science.jsonl", "section"),
         "docstrings": ("benchmarks/effect/corpus/python-stdlib-docstrings.jsonl", "package")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", type=Path, required=True, help="the pretraining corpus (.jsonl.gz)")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "leak_check.json")
    args = parser.parse_args(argv)
    general = [r["text"] for r in read_texts([str(args.corpus)])[0]]
    record = {"corpus_texts_sha256": texts_sha256(general), "corpus_texts": len(general),
              "near_duplicate_threshold": neardup.THRESHOLD, "tasks": {}}
    for name, (path, label) in TASKS.items():
        started = time.perf_counter()
        rows, _ = read_labeled(str(ROOT / path), label_field=label)
        texts = [r["text"] for r in rows]
        config = EvaluateConfig(labeled=ROOT / path, label_field=label, output=Path("unused"), model="unused",
                                general_corpus=[str(args.corpus)])
        try:
            outcome = check_general_corpus(config, texts)[0]["general"]
            passed = True
        except SystemExit as refused:  # evaluate would refuse the corpus: say how many and which
            outcome, passed = str(refused), False
        leaking = [] if passed else neardup.with_near_duplicate(texts, general)  # which ones, when refused
        record["tasks"][name] = {"file": path, "sha256": sha256_file(str(ROOT / path)), "labeled_texts": len(texts),
                                 "evaluate_accepts_the_corpus": passed, "evaluate_says": outcome,
                                 "labeled_texts_with_a_near_duplicate": len(leaking),
                                 "examples": [texts[i][:200] for i in sorted(leaking)[:5]],
                                 "seconds": round(time.perf_counter() - started, 1)}
        print(f"{name}: {len(leaking)} of {len(texts)} labeled texts have a near-duplicate in the corpus "
              f"(evaluate {'accepts' if passed else 'refuses'} it)", flush=True)
    # The fill-mask test's sentences (fill_mask.json), each with every accepted answer in its [MASK], must be
    # sentences the model never read: searched in the corpus as lower-case text with spaces collapsed.
    corpus = " ".join(" ".join(general).lower().split())
    sentences = json.loads((Path(__file__).parent / "fill_mask.json").read_text(encoding="utf-8"))["sentences"]
    record["fill_mask_sentences_found_in_corpus"] = {
        s["text"]: sum(corpus.count(" ".join(s["text"].replace("[MASK]", answer).lower().split()))
                       for answer in s["answers"]) for s in sentences}
    print(f"fill-mask sentences found in the corpus: {sum(record['fill_mask_sentences_found_in_corpus'].values())}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
