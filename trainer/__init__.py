"""`maskstream.trainer`: the GPU side of maskstream: stream dataset shards, draw masks, train.

Imports `maskstream.schemas`, never `maskstream.pipelines` and never apache_beam: a training box
must not need Beam.
"""
