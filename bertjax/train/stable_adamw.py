"""StableAdamW: AdamW with Adafactor's update clipping, per tensor.

Wortsman et al. 2023, "Stable and low-precision training for large-scale vision-language models"
(arXiv:2304.13013), Algorithm 2, as implemented by optimi's StableAdamW (github.com/warner-benjamin/
optimi, optimi/stableadamw.py, `_single_param_stableadamw`), the optimizer ModernBERT trains with:

    m_t, v_t  Adam's moments;  m^_t, v^_t  their bias-corrected values
    RMS_t = sqrt(mean(g_t^2 / max(v^_t, eps^2)))        over one tensor
    eta_t = lr_t / max(1, RMS_t)
    theta_t = theta_{t-1} - eta_t * (m^_t / (sqrt(v^_t) + eps) + lambda * theta_{t-1})

optimi keeps the moments already debiased (its "debiased betas"); that is algebraically the same
as raw moments divided by 1 - beta^t, which optax's state holds. The clipped rate eta_t scales the
weight-decay term too, as in optimi and in Wortsman's reference code.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax


def update_scale(grad: jax.Array, nu_hat: jax.Array, eps: float) -> jax.Array:
    """1 / max(1, RMS_t) for one tensor: below 1 only where the gradient is large next to its
    second-moment estimate (a stale v^_t), the case that causes loss spikes with a high beta2.
    Computed in float32 whatever the parameter dtype, so bf16 moments do not bias the mean."""
    if grad.size == 0:
        return jnp.ones([], jnp.float32)
    ratio = jnp.square(grad.astype(jnp.float32)) / jnp.maximum(nu_hat.astype(jnp.float32),
                                                                eps * eps)
    return 1.0 / jnp.maximum(1.0, jnp.sqrt(jnp.mean(ratio)))


def scale_by_stable_adam(b1: float, b2: float, eps: float, weight_decay: float = 0.0,
                         mask: Callable[[Any], Any] | None = None
                         ) -> optax.GradientTransformation:
    """The StableAdamW step before the (negated, scheduled) learning rate: the Adam direction plus
    `weight_decay` * params where `mask(params)` is True, each tensor divided by max(1, RMS_t).

    Weight decay lives here, not in a following optax.add_decayed_weights, because the per-tensor
    scale must multiply it as well and a later transformation cannot see RMS_t. The state is
    optax's ScaleByAdamState (raw moments), the layout of the other optimizers.
    """

    def init_fn(params):
        return optax.ScaleByAdamState(count=jnp.zeros([], jnp.int32),
                                      mu=optax.tree.zeros_like(params),
                                      nu=optax.tree.zeros_like(params))

    def update_fn(updates, state, params=None):
        if weight_decay and params is None:
            raise ValueError(optax.NO_PARAMS_MSG)
        mu = optax.tree.update_moment(updates, state.mu, b1, 1)
        nu = optax.tree.update_moment_per_elem_norm(updates, state.nu, b2, 2)
        count = optax.safe_increment(state.count)
        mu_hat = optax.tree.bias_correction(mu, b1, count)
        nu_hat = optax.tree.bias_correction(nu, b2, count)
        reference = updates if params is None else params
        decays = (jax.tree.map(lambda _: True, reference) if mask is None else mask(reference))

        def step(grad, m, v, param, decayed):
            direction = m / (jnp.sqrt(v) + eps)
            if weight_decay and decayed:
                direction = direction + weight_decay * param
            return (direction * update_scale(grad, v, eps)).astype(grad.dtype)

        new = jax.tree.map(step, updates, mu_hat, nu_hat, reference, decays)
        return new, optax.ScaleByAdamState(count=count, mu=mu, nu=nu)

    return optax.GradientTransformation(init_fn, update_fn)
