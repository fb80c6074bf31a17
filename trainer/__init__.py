"""The GPU side of maskstream: stream dataset shards, draw masks, train.

May import `schemas`, never `pipelines` and never apache_beam: a training box must not need Beam.
"""
