"""Parameter trees as {"encoder/pooler/kernel": array} for comparing them leaf by leaf."""

import numpy as np
from flax import traverse_util


def flat(tree) -> dict[str, np.ndarray]:
    return {name: np.asarray(leaf)
            for name, leaf in traverse_util.flatten_dict(tree, sep="/").items()}
