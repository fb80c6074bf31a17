"""The pure core of a build: the word table's rows, tokens and windows, the word encoder and the
signal tallies (the word lookup and the mask-probability formula are `maskstream.mask_signal`'s);
no Beam, no I/O beyond the tokenizer cache."""
