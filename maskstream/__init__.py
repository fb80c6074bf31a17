"""maskstream: Difference-Masking data pipelines (Apache Beam) and a streaming MLM trainer (PyTorch)."""

__version__ = "0.1.0"
