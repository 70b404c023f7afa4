"""posttrain: Nemotron-style post-training on a laptop CPU."""

__version__ = "0.1.0"
