"""The Beam side of maskstream: corpus statistics, seeds, and the dataset build.

May import `schemas`, never `trainer`.
"""
