"""The two layouts of the encoder's layers: stacked under `layers` (nn.scan) or `layer_0..N-1`.

A checkpoint made with one layout loads into a model built with the other by restacking, so
`model.scan_layers` stays a speed switch and never a compatibility break.
"""

from __future__ import annotations

import re
from typing import Any, Mapping

import numpy as np

STACKED = "layers"
_LAYER = re.compile(r"layer_(\d+)$")


def is_scanned(encoder_params: Mapping[str, Any]) -> bool:
    return STACKED in encoder_params


def layer_count(encoder_params: Mapping[str, Any]) -> int:
    if is_scanned(encoder_params):
        leaf = next(iter(_leaves(encoder_params[STACKED])))
        return int(np.shape(leaf)[0])
    return sum(1 for name in encoder_params if _LAYER.match(name))


def to_scanned(encoder_params: Mapping[str, Any]) -> dict:
    """layer_0..layer_{N-1} -> one `layers` subtree with a leading layer axis."""
    if is_scanned(encoder_params):
        return dict(encoder_params)
    names = sorted((n for n in encoder_params if _LAYER.match(n)),
                   key=lambda n: int(_LAYER.match(n).group(1)))
    rest = {k: v for k, v in encoder_params.items() if not _LAYER.match(k)}
    if not names:
        return rest
    rest[STACKED] = _map(lambda *xs: np.stack([np.asarray(x) for x in xs]),
                         *[encoder_params[n] for n in names])
    return rest


def to_unscanned(encoder_params: Mapping[str, Any]) -> dict:
    """One `layers` subtree with a leading layer axis -> layer_0..layer_{N-1}."""
    if not is_scanned(encoder_params):
        return dict(encoder_params)
    count = layer_count(encoder_params)
    rest = {k: v for k, v in encoder_params.items() if k != STACKED}
    for i in range(count):
        rest[f"layer_{i}"] = _map(lambda x, i=i: np.asarray(x)[i], encoder_params[STACKED])
    return rest


def like(encoder_params: Mapping[str, Any], scanned: bool) -> dict:
    return to_scanned(encoder_params) if scanned else to_unscanned(encoder_params)


def _map(fn, *trees):
    first = trees[0]
    if isinstance(first, Mapping):
        return {k: _map(fn, *(t[k] for t in trees)) for k in first}
    return fn(*trees)


def _leaves(tree):
    if isinstance(tree, Mapping):
        for value in tree.values():
            yield from _leaves(value)
    else:
        yield tree
