"""What maskstream needs to know about a tokenizer, cached on disk by the tokenizer's content.

Loading a Hugging Face tokenizer (`AutoTokenizer.from_pretrained`) imports transformers and reads
its files: about 1.2 s, paid by every `build`, `update` and `watch` start only to check the
tokenizer, hash its definition and read a few token ids. `tokenizer_facts` computes those once
per tokenizer content and keeps them as one JSON file in the user's cache
($MASKSTREAM_CACHE, else ~/.cache/maskstream; `tokenizers/SHA256.json`): the fast tokenizer's
whole definition (what `load_backend_tokenizer` rebuilds the Rust tokenizer from), what
`check_tokenizer` found, the packing separator and the manifest's tokenizer entry.

The key hashes every small file of a local tokenizer folder (its JSON, vocabularies and
SentencePiece models; not the weights), the installed transformers and tokenizers versions and
FACTS_FORMAT, so an edited tokenizer or an upgraded library is loaded afresh. A hub name
(no local folder) is not cached: its files are found through the hub's own cache.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
from importlib import metadata
from pathlib import Path
from typing import Any

from maskstream.mask_signal.alignment import align_tokens_to_words
from maskstream.mask_signal.words import word_boundaries
from maskstream.schemas.manifest import vocab_hash
from maskstream.storage.publish import write_atomically

LOG = logging.getLogger("maskstream.tokenizer")

FACTS_FORMAT = 1  # bump when what the facts hold, or how they are computed, changes
TOKENIZER_FILE_SUFFIXES = (".json", ".txt", ".model", ".vocab")  # what a tokenizer folder's tokenizer reads


def cache_root() -> Path:
    """$MASKSTREAM_CACHE, else ~/.cache/maskstream."""
    return Path(os.environ.get("MASKSTREAM_CACHE") or Path.home() / ".cache" / "maskstream")


def content_key(name: str) -> str | None:
    """sha256 of a local tokenizer folder's files and the libraries that read them; None for a hub name."""
    if not os.path.isdir(name):
        return None
    digest = hashlib.sha256(f"format {FACTS_FORMAT}".encode())
    for library in ("transformers", "tokenizers"):
        digest.update(f"{library} {metadata.version(library)}".encode())
    for path in sorted(Path(name).iterdir()):
        if path.is_file() and path.name.endswith(TOKENIZER_FILE_SUFFIXES):
            digest.update(path.name.encode() + b"\0" + hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


@functools.lru_cache(maxsize=4)
def tokenizer_facts(name: str) -> dict[str, Any]:
    """{"backend": the fast tokenizer's definition (JSON, padding and truncation off) or None for a
    slow tokenizer, "problems": why maskstream cannot use it (empty if it can), "pack_problem":
    why it cannot pack documents, "pack_separator": the packing separator's ids, "info": the
    manifest's tokenizer entry (without the model's names)}; from the disk cache when there."""
    key = content_key(name)
    path = cache_root() / "tokenizers" / f"{key}.json" if key else None
    if path is not None and path.exists():
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:  # a damaged entry is recomputed and rewritten
            LOG.warning("tokenizer cache %s unreadable (%s): recomputing", path, e)
    facts = compute_tokenizer_facts(name)
    if path is not None:
        try:
            write_atomically(str(path), json.dumps(facts).encode("utf-8"))  # a concurrent reader sees all or nothing
        except OSError as e:  # a read-only home only costs the next start the same second
            LOG.info("tokenizer cache not written (%s)", e)
    return facts


def compute_tokenizer_facts(name: str) -> dict[str, Any]:
    """The facts of `tokenizer_facts`, from the loaded Hugging Face tokenizer."""
    # heavy: torch and transformers load only when a model is needed (--help stays fast)
    from tokenizers import Tokenizer

    hf = load_tokenizer(name)
    problems, pack_problem, backend, separator = [], None, None, []
    if not hf.is_fast:
        problems.append(f"no fast tokenizer ({type(hf).__name__} is a slow, Python-only tokenizer, which reports "
                        "no character offsets): use a model folder with a tokenizer.json (the `tokenizers` library)")
    if hf.mask_token is None or hf.mask_token_id is None:
        problems.append("no mask token (mask_token is None): masked-language-model training needs one; add it "
                        "(`tokenizer.add_special_tokens({'mask_token': '<mask>'})`, save, resize the model's "
                        "embeddings) or pick a model trained with one")
    if hf.is_fast:
        rust = Tokenizer.from_str(hf.backend_tokenizer.to_str())
        rust.no_padding()
        rust.no_truncation()
        backend = rust.to_str()
        encoding = rust.encode(OFFSETS_PROBE, add_special_tokens=False)
        starts, ends = word_boundaries(OFFSETS_PROBE)
        spans = align_tokens_to_words([s for s, _ in encoding.offsets], [e for _, e in encoding.offsets],
                                      starts, ends).span
        missing = len(starts) - len(set(spans[spans >= 0].tolist()))
        if missing:
            problems.append(f"no usable character offsets: {missing} of the {len(starts)} words of "
                            f"{OFFSETS_PROBE!r} overlap no token's offsets")
        # The token between packed documents: the last one the tokenizer appends to a sequence (BERT
        # `[SEP]`, RoBERTa and T5 `</s>`), else its eos or sep token (Llama-style templates add a BOS only).
        # (Not asked of a tokenizer without offsets: it may encode "a" to specials only.)
        suffix = [] if missing else special_template(rust)[1]
        if suffix:
            separator = suffix[-1:]
        elif not missing:
            token = hf.eos_token_id if hf.eos_token_id is not None else hf.sep_token_id
            separator = [] if token is None else [int(token)]
        if not separator and not missing:
            pack_problem = ("no end-of-sequence token to separate packed documents (--packing pack): "
                            "use --packing truncate or a tokenizer with an eos or sep token")
    info = {
        "class": type(hf).__name__,
        "vocab_hash": vocab_hash(hf.get_vocab()),
        "vocab_size": len(hf),
        "pad_token_id": hf.pad_token_id,
        "mask_token_id": hf.mask_token_id,
        "cls_token_id": hf.cls_token_id,
        "sep_token_id": hf.sep_token_id,
        "unk_token_id": hf.unk_token_id,
        "all_special_ids": sorted(set(hf.all_special_ids)),
    }
    return {"backend": backend, "problems": problems, "pack_problem": pack_problem, "pack_separator": separator,
            "info": info}


# Words whose tokens `check_tokenizer` expects the tokenizer's offsets to find.
OFFSETS_PROBE = "Offsets: every word of this probe, e.g. x86_64 or naïve, maps to its own tokens."


# --- loading and checking a tokenizer -----------------------------------------------------------


@functools.lru_cache(maxsize=4)
def load_tokenizer(name: str):
    """The Hugging Face tokenizer `name`, loaded once per process (its callers set padding and
    truncation per call, as the tokenizer's own `__call__` does)."""
    # heavy: torch and transformers load only when a model is needed (--help stays fast)
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(name)


@functools.lru_cache(maxsize=4)
def load_backend_tokenizer(name: str):
    """The fast tokenizer's Rust backend, without the padding/truncation its config may carry
    (loaded once per process and name, from tokenizer_facts' cache when there; callers only encode
    with it)."""
    # heavy: torch and transformers load only when a model is needed (--help stays fast)
    from tokenizers import Tokenizer

    backend = tokenizer_facts(name)["backend"]
    if backend is None:
        raise ValueError(f"{name}: maskstream needs a fast (Rust) tokenizer for offsets")
    return Tokenizer.from_str(backend)


def check_tokenizer(name: str, packing: str = "truncate") -> None:
    """Refuses, before a build starts, a tokenizer maskstream cannot map to words or mask with:
    raises ValueError saying everything that is missing (tokenizer_facts, cached by content)."""
    facts = tokenizer_facts(name)
    problems = list(facts["problems"])
    if packing == "pack" and facts["pack_problem"]:
        problems.append(facts["pack_problem"])
    if problems:
        raise ValueError(f"tokenizer {name} cannot be used: " + "; ".join(problems))


def special_template(tokenizer) -> tuple[list[int], list[int]]:
    """(prefix ids, suffix ids) the tokenizer puts around one sequence, e.g. [CLS] / [SEP]."""
    encoding = tokenizer.encode("a", add_special_tokens=True)
    mask = encoding.special_tokens_mask
    first = mask.index(0)
    last = len(mask) - 1 - mask[::-1].index(0)
    return list(encoding.ids[:first]), list(encoding.ids[last + 1 :])


def pack_separator(name: str) -> list[int]:
    """The token between packed documents (tokenizer_facts): the last one the tokenizer appends to
    a sequence, else its eos or sep token; [] when it has none."""
    return list(tokenizer_facts(name)["pack_separator"])
