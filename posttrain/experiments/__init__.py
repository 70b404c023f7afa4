"""Experiments built on the library: the main pipeline and the curation comparison.

Nothing in the library imports this package (enforced by import-linter).
"""
