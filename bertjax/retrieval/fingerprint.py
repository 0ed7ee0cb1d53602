"""Which model made a set of vectors: a fingerprint of a loaded model's config and parameters.

Vectors from two models live in different spaces, so an index must be searched with the model
that built it. The path alone does not say that (a workdir trains on; one model is copied to
another place), so the fingerprint hashes the encoder config with, for every parameter array,
its name, shape, dtype and 64 values spread over it: any training step or other checkpoint
changes them, while hashing them costs microseconds even for a large model.
"""

from __future__ import annotations

import hashlib
import json

import numpy as np

SAMPLED_VALUES = 64


def _leaves(tree, prefix=()):
    if isinstance(tree, dict):
        for key in sorted(tree):
            yield from _leaves(tree[key], prefix + (str(key),))
    else:
        yield "/".join(prefix), np.asarray(tree)


def fingerprint(encoder, params: dict) -> str:
    """A hex digest of `encoder` (an EncoderConfig) and the parameter tree `params`."""
    digest = hashlib.sha256(json.dumps(encoder.record(), sort_keys=True).encode())
    for name, array in _leaves(params):
        flat = array.reshape(-1)
        step = max(1, flat.size // SAMPLED_VALUES)
        digest.update(f"{name}:{array.shape}:{array.dtype}".encode())
        digest.update(np.ascontiguousarray(flat[::step][:SAMPLED_VALUES]).tobytes())
    return digest.hexdigest()[:32]
