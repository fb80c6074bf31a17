"""Names and versions of the formulas whose results are stored.

A dataset's manifest and `seeds.json` record these, so a reader can tell whether two
outputs were computed the same way. Change the version whenever a formula changes.

- `word_normalization`: see `maskstream.mask_signal.words`.
- `tf_icf`: `tf_icf(w) = (tf_D(w) / sum_v tf_D(v)) * log(1 / max(f_G(w), floor))`, with
  `f_G` the word's relative frequency in general text and `floor` the frequency assumed for
  words general text lacks: `TF_ICF_UNSEEN_COUNT` (default 0.5) occurrences at the general
  source's resolution, i.e. `0.5 * 1e-8 = 5e-9` for the wordfreq tables (their English list
  stops at `WORDFREQ_RESOLUTION = 1e-8`) and `0.5 / T` for a general corpus of `T` words.
  Computed in `pipelines/statistics/tf_icf.py`; `maskstream stats --unseen-count` changes it.
- `background_contrast` (`maskstream stats --background-input`): the domain's words scored
  against a background corpus the user's model already knows (all package descriptions for the
  science ones, all man pages for section 3):
  `contrast(w) = tf_icf(w) * max(0, log(p_D(w) / max(f_B(w), floor_B)))`, with `p_D(w) =
  tf_D(w) / sum tf_D` and `f_B` the word's relative frequency in the background (floor_B =
  `TF_ICF_UNSEEN_COUNT / T_B` for a background of `T_B` words). TF-ICF keeps words rare in
  general language; the log-lift keeps only those the domain uses more than its background, so
  words of the kind of text (`package`, `files`, `provides`) drop to about 0. Computed in
  `pipelines/statistics/tf_icf.py`.
- `mask_probability`: per sequence, weights from each word's nearest-seed similarity raised to
  the power `sharpness` (1: the paper's map), or the rank, mixed with uniform by alpha, scaled
  so the expected number of masked tokens equals the budget times the number of non-special
  tokens, clipped to 1 with the excess redistributed; with a `floor` f > 0, p = f + (1 - f) p'
  for the budget (budget - f) / (1 - f); special tokens 0. Still `difference-masking-v1`: the
  defaults (sharpness 1, floor 0) give the same bytes as before, and the manifest's config
  records both.
"""

# The word definition of maskstream.mask_signal.words (normalization, then runs of letters and digits).
WORD_NORMALIZATION = "nfkc-lower-alnum-v1"

# TF-ICF's smoothing of words general text lacks (see above).
TF_ICF_UNSEEN_COUNT = 0.5
WORDFREQ_RESOLUTION = 1e-8

# The peers' signals (`maskstream build --peer-signals`): pipelines/statistics/peer_formulas.py.
PEER_FORMULA_VERSIONS: dict[str, str] = {
    "collocations": "pmi-ngram-v2",  # v2: n-grams counted within phrases, not sentences (c75ee10)
    "informative_relevance": "informative-relevance-v1",
}

FORMULA_VERSIONS: dict[str, str] = {
    "word_normalization": WORD_NORMALIZATION,
    "tf_icf": "tf-icf-v1",
    "background_contrast": "tf-icf-log-lift-v1",
    "mask_probability": "difference-masking-v1",
}
