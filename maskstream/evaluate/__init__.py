"""`maskstream evaluate`: does a masking strategy beat random masking on a labeled task?

design (arms, settings, cross-fitted folds), neardup (exact near-duplicate join), corpora (readers
with rejects), probe (frozen features, out-of-fold logistic regression), statistics (paired tests,
TOST, power, the hierarchical bootstrap), experiment (prepare, TAPT, run), report (REPORT.md).
"""
