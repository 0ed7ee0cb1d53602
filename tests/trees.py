"""Parameter trees as {"encoder/pooler/kernel": array} for comparing them leaf by leaf."""

import numpy as np


def flat(tree, prefix: str = "") -> dict[str, np.ndarray]:
    if isinstance(tree, dict):
        return {name: leaf for key, sub in tree.items()
                for name, leaf in flat(sub, f"{prefix}{key}/").items()}
    return {prefix.rstrip("/"): np.asarray(tree)}
