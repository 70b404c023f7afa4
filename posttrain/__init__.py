"""posttrain: Nemotron-style post-training on a laptop CPU."""

__version__ = "0.1.0"

# Before anything imports torch: on AMD CPUs, lift Intel MKL's vendor check, which runs torch's fp32
# matmuls 1.3-2.5x slower there (models/blas.py; POSTTRAIN_MKL_AMD=0 turns it off).
from posttrain.models import blas as _blas

_blas.enable()
