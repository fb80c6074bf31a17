"""Stage 1: corpus-wide word counts, TF-ICF against general English or a background corpus, seeds."""
