"""Loss and accuracy curves of a run, drawn from its metrics.jsonl into a PNG."""

from __future__ import annotations

import os

from bertjax.train.metrics_log import read_metrics

CURVES_FILE = "curves.png"


def plot_curves(workdir: str, output: str | None = None) -> str | None:
    """Draws training (and held-out) loss and accuracy against step; returns the PNG path."""
    records = read_metrics(workdir)
    if not records:
        return None
    # deferred: pyplot takes ~1 s to import, and only this end-of-run drawing needs it
    import matplotlib

    matplotlib.use("Agg")  # no display on training machines
    import matplotlib.pyplot as plt  # deferred with matplotlib, above

    accuracy_key = "mlm_accuracy" if any("mlm_accuracy" in r for r in records) else "accuracy"
    panels = [("loss", "loss"), (accuracy_key, accuracy_key.replace("_", " "))]
    fig, axes = plt.subplots(1, len(panels), figsize=(11, 4))
    for ax, (key, title) in zip(axes, panels):
        for prefix, style in (("", "-"), ("eval_", "o--")):
            points = [(r["step"], r[prefix + key]) for r in records
                      if isinstance(r.get(prefix + key), (int, float))]
            if points:
                steps, values = zip(*points)
                ax.plot(steps, values, style, label="held-out" if prefix else "train")
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    path = output or os.path.join(workdir, CURVES_FILE)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
