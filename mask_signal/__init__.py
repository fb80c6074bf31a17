"""`maskstream.mask_signal`: the mask signal, in one place both sides share.

What turns words into per-token mask probabilities, imported by the build (`maskstream.pipelines`), the
trainer (`maskstream.trainer`) and the commands alike, with no Beam and no torch at import:

- `words`: what a word is (`word_spans`, `normalize_word`), the definition the statistics count;
- `alignment`: which word each token belongs to (`align_tokens_to_words`, `token_words`);
- `word_lookup`: a word type's row in the word table, as sorted 64-bit hashes (`WordLookup`);
- `probability`: the difference-masking formula (`mask_probabilities_flat`) and its one scaling to
  a budget (`scale_to_budget`, for numpy arrays and torch tensors alike);
- `mask_map`: a dataset version's signal applied to any text at load time (`MaskMap`).
"""
