"""The pure core of a build: word types as compact arrays, tokens and windows, the word encoder and
per-token mask probabilities; no Beam, no I/O beyond the tokenizer cache."""
