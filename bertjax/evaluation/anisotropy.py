"""Anisotropy of a model's contextual embeddings, layer by layer, before and after
standardisation (`python -m bertjax.evaluate anisotropy`; the measures are
`bertjax.vectors.anisotropy`'s, the transforms `bertjax.vectors.standardizer`'s).

Every token of the sentences but [CLS] and the final [SEP] is a vector of each hidden state (0 =
the embedding output .. L = the last layer). A "word" for self-similarity is a token that is a
whole alphabetic word (not a "##" piece, not followed by one), identified by its token id. Each
layer is measured raw, z-scored and with all-but-the-top applied, the statistics fitted on that
layer's own token vectors of the same sentences.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from bertjax.core.errors import UserError
from bertjax.vectors import anisotropy, standardizer

VARIANTS = ("raw", standardizer.ZSCORE, standardizer.ALL_BUT_THE_TOP)


@dataclasses.dataclass
class TokenStates:
    layers: list[np.ndarray]   # per hidden state: [N, H] float32, one row per token
    sentences: np.ndarray      # [N] the sentence each row comes from
    words: np.ndarray          # [N] token id of a whole word, -1 otherwise


def token_states(model, texts: Sequence[str]) -> TokenStates:
    encoded = model.encode(list(texts), layers="all")
    layers: list[list[np.ndarray]] = [[] for _ in range(model.num_layers + 1)]
    sentences, words = [], []
    for number, item in enumerate(encoded):
        inner = slice(1, len(item.tokens) - 1)
        tokens = item.tokens[inner]
        if not tokens:
            continue
        for layer, states in enumerate(item.hidden):
            layers[layer].append(states[inner])
        sentences += [number] * len(tokens)
        following = tokens[1:] + [""]
        words += [int(token_id) if token.isalpha() and not after.startswith("##") else -1
                  for token, after, token_id in zip(tokens, following, item.ids[inner])]
    if len(sentences) < 2:
        raise UserError("the corpus gives fewer than 2 tokens; anisotropy needs sentences")
    return TokenStates([np.concatenate(rows) for rows in layers], np.asarray(sentences),
                       np.asarray(words))


def measure(states: TokenStates, *, components: int | None = None, seed: int = 0
            ) -> dict[str, list[anisotropy.Geometry]]:
    """variant ("raw", "zscore", "all-but-the-top") -> one Geometry per hidden state."""
    results: dict[str, list[anisotropy.Geometry]] = {variant: [] for variant in VARIANTS}
    for vectors in states.layers:
        for variant in VARIANTS:
            transformed = vectors
            if variant != "raw":
                fitted = standardizer.fit([vectors], variant, {"vectors": "tokens"},
                                          components=components)
                transformed = fitted.apply(vectors)
            results[variant].append(anisotropy.measure(transformed, states.sentences,
                                                       states.words, seed))
    return results


def table(results: dict[str, list[anisotropy.Geometry]]) -> str:
    header = (f"{'variant':<16}{'layer':>6}{'baseline cos':>14}{'self-sim':>10}"
              f"{'self-sim - base':>17}{'top-1 var':>11}{'top-10 var':>12}")
    lines = [header]
    for variant, per_layer in results.items():
        for layer, g in enumerate(per_layer):
            lines.append(f"{variant:<16}{layer:>6}{g.baseline:>14.4f}{g.self_similarity:>10.4f}"
                         f"{g.self_similarity - g.baseline:>17.4f}{g.top1_variance:>11.4f}"
                         f"{g.top10_variance:>12.4f}")
    return "\n".join(lines)


def plot(results: dict[str, list[anisotropy.Geometry]], path, title: str) -> None:
    """Three panels (baseline cosine, self-similarity, top-10 variance share) against the
    layer, one line per variant, written as a PNG."""
    # deferred: pyplot takes ~1 s to import, and only this drawing needs it
    import matplotlib

    matplotlib.use("Agg")  # no display on training machines
    import matplotlib.pyplot as plt  # deferred with matplotlib, above

    panels = (("baseline", "mean cosine of random tokens"),
              ("self_similarity", "self-similarity across contexts"),
              ("top10_variance", "variance share of the top 10 dimensions"))
    figure, axes = plt.subplots(1, len(panels), figsize=(13, 3.8))
    for axis, (field, label) in zip(axes, panels):
        for variant, per_layer in results.items():
            axis.plot(range(len(per_layer)), [getattr(g, field) for g in per_layer],
                      marker="o", label=variant)
        axis.set_xlabel("layer (0 = embeddings)")
        axis.set_title(label, fontsize=10)
        axis.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    figure.suptitle(title, fontsize=10)
    figure.tight_layout()
    figure.savefig(path, dpi=100, format="png")  # `path` may be an open file
    plt.close(figure)
