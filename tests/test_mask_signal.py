"""The signal layer (`maskstream.mask_signal`): one scaling rule for the build (numpy) and the trainer
(torch), and a layer both sides can import without Beam or torch."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from maskstream.mask_signal.probability import mask_probabilities_flat, scale_to_budget


@st.composite
def weighted_rows(draw):
    """Rows of weights with zeros, ties and a few heavy tokens (the ones water-filling clips), a
    `valid` mask with padding, and a per-row target up to every valid token."""
    rows, length = draw(st.integers(1, 9)), draw(st.integers(1, 70))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    q = rng.random((rows, length)) ** draw(st.sampled_from([1.0, 4.0, 12.0]))  # sharper: more clipping
    q[rng.random((rows, length)) < draw(st.floats(0.0, 0.6))] = 0.0
    valid = rng.random((rows, length)) < draw(st.floats(0.3, 1.0))
    q = np.where(valid, q, 0.0)
    budget = draw(st.floats(0.01, 1.0))
    return q, valid, np.round(budget * valid.sum(axis=1))


@settings(max_examples=200, deadline=None)
@given(weighted_rows())
def test_numpy_and_torch_scale_to_the_same_probabilities(rows):
    q, valid, target = rows
    on_numpy = scale_to_budget(q, valid, target)
    on_torch = scale_to_budget(torch.from_numpy(q), torch.from_numpy(valid), torch.from_numpy(target).long())
    assert isinstance(on_torch, torch.Tensor)
    np.testing.assert_allclose(on_torch.numpy(), on_numpy, rtol=0, atol=1e-6)
    # What the rule promises, read on numpy: each p in [0, 1], 0 where q is 0 or the token is not
    # valid, and each row's sum is its target, or every token with q > 0 at 1 when that is fewer.
    assert on_numpy.min() >= 0.0 and on_numpy.max() <= 1.0
    assert not on_numpy[(q == 0) | ~valid].any()
    reachable = np.minimum(target, ((q > 0) & valid).sum(axis=1))
    np.testing.assert_allclose(on_numpy.sum(axis=1), reachable, rtol=0, atol=1e-9)


def test_the_scaling_clips_a_heavy_token_and_gives_its_excess_to_the_others():
    q = np.array([[8.0, 1.0, 1.0, 0.0]])
    p = scale_to_budget(q, np.array([[True, True, True, True]]), np.array([2.0]))
    np.testing.assert_allclose(p, [[1.0, 0.5, 0.5, 0.0]])


def test_the_build_formula_sums_to_the_budget_on_real_shapes():
    """mask_probabilities_flat through the shared scaling: a sequence's probabilities sum to budget x
    its non-special tokens (two sequences, one with a special token at each end, and unknown words)."""
    word_ids = np.array([-1, 0, 1, 1, 2, -1, 0, 1, 2], np.int64)
    word_index = np.array([-1, 0, 1, 1, -1, -1, 2, 0, 1], np.int64)
    special = np.array([1, 0, 0, 0, 0, 1, 0, 0, 0], np.int8)
    offsets = np.array([0, 6, 9], np.int64)
    p = mask_probabilities_flat(word_ids, word_index, special, offsets, np.array([0.9, 0.2, 0.4], np.float32),
                                budget=0.5, width=8)
    assert p[special == 1].tolist() == [0.0, 0.0]
    np.testing.assert_allclose([p[:6].sum(), p[6:].sum()], [0.5 * 4, 0.5 * 3], rtol=1e-6)


@pytest.mark.slow
def test_the_signal_layer_imports_neither_beam_nor_torch():
    code = ("import sys\n"
            "import maskstream.mask_signal.alignment, maskstream.mask_signal.mask_map\n"
            "import maskstream.mask_signal.probability, maskstream.mask_signal.word_lookup\n"
            "import maskstream.mask_signal.words\n"
            "print(sorted(m for m in ('apache_beam', 'torch', 'transformers') if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_mask_settings_check_their_own_ranges():
    """One place for the mask probabilities' ranges: the build's options, a manifest's config and a MaskMap
    all make a MaskSettings."""
    from maskstream.mask_signal.probability import MaskSettings

    for bad, message in (({"budget": 0.0}, r"--budget must be in \(0, 1\]"), ({"alpha": 1.5}, "--alpha must be"),
                         ({"weighting": "inverse"}, "--weighting must be one of"),
                         ({"sharpness": 0.0}, "--sharpness must be > 0"),
                         ({"budget": 0.1, "floor": 0.2}, r"--floor must be in \[0, --budget = 0.1\]")):
        with pytest.raises(ValueError, match=message):
            MaskSettings.of(bad)
    assert MaskSettings.of({"budget": 0.2, "max_length": 0}).budget == 0.2  # 0: each batch's longest row
