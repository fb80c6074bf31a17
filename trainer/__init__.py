"""`maskstream.trainer`: the GPU side of maskstream: stream dataset shards, draw masks, train.

Imports `maskstream.schemas` and `maskstream.mask_signal`, never `maskstream.pipelines` and never
apache_beam: a training box must not need Beam.
"""
