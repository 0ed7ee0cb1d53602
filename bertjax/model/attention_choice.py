"""Which kernel computes each kind of attention layer, by `model.attention_implementation` and
the platform of the devices the step is compiled for.

    auto      TPU: Pallas splash attention, global and sliding-window layers (padding and packed
              rows as segment ids, the window as a local mask), forward and backward.
              GPU: cuDNN's fused attention for global layers in bfloat16 or float16 without
              packed rows (cuDNN takes padding as key lengths and has no segment ids and no
              two-sided window in jax.nn.dot_product_attention); XLA otherwise.
              CPU: XLA (jax.nn.dot_product_attention; the blocked window of local_attention.py).
    xla       XLA on every platform.
    cudnn     cuDNN where it applies (global layers, no packed rows), XLA otherwise.
    splash    the splash kernel on every platform: off a TPU in Pallas's interpreter (exact,
              slow: what the tests run).
    explicit  the probabilities spelled out (einsum, fp32 softmax): BERT's attention dropout
              needs them, so training with attention dropout takes this path under `auto`,
              and so does DeBERTa's disentangled attention always (its position terms).

The platform is the abstract mesh's (set while the step is traced, train/step.py): for
`python -m bertjax.compile` that is the TPU it compiles for, whatever the host runs on.
"""

from __future__ import annotations

from bertjax.model.config import EncoderConfig

GLOBAL, SLIDING_WINDOW = "global", "sliding_window"
XLA, CUDNN, SPLASH, EXPLICIT = "xla", "cudnn", "splash", "explicit"
_HALF_PRECISION = ("bfloat16", "float16")


def layer_kinds(config: EncoderConfig) -> tuple[str, ...]:
    return (GLOBAL, SLIDING_WINDOW) if config.has_local_layers else (GLOBAL,)


def choose(config: EncoderConfig, kind: str, *, platform: str, dropout: bool,
           packed: bool) -> str:
    """The kernel of a layer of `kind` (GLOBAL or SLIDING_WINDOW). `dropout`: attention
    dropout applies (training with model.attention_dropout > 0); `packed`: rows hold several
    sequences (pack ids)."""
    requested = config.attention_implementation
    if dropout or requested == EXPLICIT or config.position_embedding == "relative":
        return EXPLICIT
    if requested in ("auto", ""):
        if platform == "tpu":
            return SPLASH
        if platform == "gpu" and config.dtype in _HALF_PRECISION:
            requested = CUDNN
        else:
            return XLA
    if requested == CUDNN:
        return CUDNN if kind == GLOBAL and not packed else XLA
    return requested


def choices(config: EncoderConfig, *, platform: str, training: bool, packed: bool) -> dict:
    """{layer kind: kernel} for a step of this model on `platform`."""
    dropout = training and config.attention_dropout > 0.0
    return {kind: choose(config, kind, platform=platform, dropout=dropout, packed=packed)
            for kind in layer_kinds(config)}
