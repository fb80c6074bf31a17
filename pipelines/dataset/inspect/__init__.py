"""Looking at a dataset version: the signal diagnostics, the text report, plots, the HTML page, and
whether a tokenizer maps its tokens to the right words."""
