"""The test suite: importable as a package (pytest puts the repository root on the path), so
tests and benchmarks share fixtures without editing sys.path."""
