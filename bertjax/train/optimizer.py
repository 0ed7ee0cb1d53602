"""Learning-rate schedules and the AdamW / LAMB / StableAdamW optimizers, with BERT's decay mask and
clipping."""

from __future__ import annotations

import dataclasses
import re
from typing import Any, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import optax

from bertjax.core.errors import UserError, check_choice
from bertjax.train.stable_adamw import scale_by_stable_adam

OPTIMIZERS = ("adamw", "lamb", "stable_adamw")
# "wsd" / "wsd_sqrt": warmup-stable-decay, the cooldown linear or 1-sqrt (ModernBERT's). Two decay
# names rather than a shape key: the shape means nothing to the other decays.
WSD_DECAYS = ("wsd", "wsd_sqrt")
DECAYS = ("linear", "cosine", "constant") + WSD_DECAYS

# BERT excluded "LayerNorm", "layer_norm" and "bias" from weight decay by variable name. In Flax
# a LayerNorm owns only "scale" and "bias", so the leaf names alone cover it; the module-name
# pattern also catches norms with other leaf names.
NO_DECAY_LEAVES = ("bias", "scale")
NO_DECAY_MODULE = re.compile(r"layer_?norm|(^|_)ln(_|\d|$)|(^|_)norm(_|\d|$)", re.IGNORECASE)


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
    """The optimizer section, BERT's pretraining optimizer by default: AdamW at 1e-4 without bias
    correction, 10k warmup steps, then linear decay; weight decay 0.01, clipping at 1.0.
    total_steps is train.steps (or what fine-tuning's epochs make), and fine-tuning warms up for
    optimizer.warmup_fraction of them instead of warmup_steps."""

    # stable_adamw: AdamW with per-tensor update clipping (ModernBERT's StableAdamW), which
    # replaces gradient clipping there (clip_norm 0); it always bias-corrects, as lamb does.
    name: str = "adamw"  # adamw | lamb | stable_adamw
    learning_rate: float = 1e-4  # peak
    warmup_steps: int = 10_000
    total_steps: int = 1_000_000
    # wsd, wsd_sqrt: warmup, the peak, then a linear or 1-sqrt (ModernBERT's) cooldown over the
    # last decay_fraction of the steps; decay_fraction 0 stays at the peak to the end.
    decay: str = "linear"  # linear | cosine | constant | wsd | wsd_sqrt
    end_learning_rate: float = 0.0
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-6
    weight_decay: float = 0.01
    # AdamW only: the original BERT AdamWeightDecayOptimizer had no bias correction; fine-tuning
    # wants it. LAMB and StableAdamW always bias-correct, as in their papers, optax and optimi.
    bias_correction: bool = False
    clip_norm: float = 1.0  # global-norm clipping; 0 disables
    # wsd decays: the cooldown's share of total_steps (0: warmup, then the peak to the end).
    decay_fraction: float = 0.1
    # optimi's decouple_lr (ModernBERT's "decoupled_stableadamw"): each step shrinks decayed
    # weights by (lr_t / learning_rate) * weight_decay, so the decay follows the schedule's shape
    # but not the peak rate; ModernBERT's weight_decay 1e-5 means this. False: lr_t * weight_decay.
    # Either way LAMB's trust ratio and StableAdamW's update clipping scale it further.
    fully_decoupled_weight_decay: bool = False

    def __post_init__(self):
        check_choice("optimizer.name", self.name, OPTIMIZERS)
        check_choice("optimizer.decay", self.decay, DECAYS)
        if not self.learning_rate > 0:
            raise UserError(f"optimizer.learning_rate must be positive, got {self.learning_rate}")
        if not 0 <= self.end_learning_rate <= self.learning_rate:
            raise UserError(f"optimizer.end_learning_rate must be in [0, learning_rate "
                            f"{self.learning_rate}], got {self.end_learning_rate}")
        if self.total_steps <= 0:
            raise UserError(f"optimizer.total_steps must be positive, got {self.total_steps}")
        if not 0 <= self.warmup_steps <= self.total_steps:
            raise UserError(f"optimizer.warmup_steps must be in [0, total_steps "
                            f"{self.total_steps}], got {self.warmup_steps}")
        for name in ("b1", "b2"):
            if not 0 <= getattr(self, name) < 1:
                raise UserError(f"optimizer.{name} must be in [0, 1), got {getattr(self, name)}")
        if not self.eps > 0:  # Adam divides by sqrt(v) + eps: 0/0 where no gradient came yet
            raise UserError(f"optimizer.eps must be positive, got {self.eps}")
        for name in ("weight_decay", "clip_norm"):
            if getattr(self, name) < 0:
                raise UserError(f"optimizer.{name} must be >= 0, got {getattr(self, name)}")
        if not 0 <= self.decay_fraction <= 1:
            raise UserError(f"optimizer.decay_fraction must be in [0, 1], "
                            f"got {self.decay_fraction}")
        if self.decay in WSD_DECAYS and self.warmup_steps + self.decay_steps > self.total_steps:
            # Fine-tuning derives warmup_steps from warmup_fraction: name neither key.
            raise UserError(f"the warmup ({self.warmup_steps} steps) overlaps the {self.decay} "
                            f"cooldown (optimizer.decay_fraction {self.decay_fraction} of "
                            f"{self.total_steps} steps: {self.decay_steps}); shorten either")

    @property
    def decay_steps(self) -> int:
        """The wsd cooldown's length; rounded, not ceiled, as 0.1 * 1100 is 110.00000000000001."""
        return round(self.decay_fraction * self.total_steps)


def warmup_stable_decay(config: OptimizerConfig) -> optax.Schedule:
    """Linear warmup to the peak, the peak until the last `decay_steps`, then a cooldown to
    `end_learning_rate` at `total_steps`: linear ("wsd") or 1 - sqrt ("wsd_sqrt", Hagele et al.
    2024, ModernBERT's decay phase). A pure function of the step, so a resumed run continues it
    exactly and the cooldown can be rerun from any plateau checkpoint."""
    peak, end = config.learning_rate, config.end_learning_rate
    warmup, decay_steps = config.warmup_steps, config.decay_steps
    decay_start = config.total_steps - decay_steps

    def schedule(count):
        step = jnp.asarray(count, jnp.float32)
        done = jnp.clip(step - decay_start, 0.0, float(decay_steps))
        # Exact at both ends, compiled too: XLA turns `done / decay_steps` into a product with a
        # rounded reciprocal, which misses 1 by an ulp.
        progress = jnp.where(done >= decay_steps, 1.0, done / decay_steps) if decay_steps else 0.0
        if config.decay == "wsd_sqrt":
            progress = jnp.sqrt(progress)
        rate = end + (peak - end) * (1.0 - progress)
        return jnp.where(step < warmup, peak * step / max(warmup, 1), rate)

    return schedule


def make_schedule(config: OptimizerConfig) -> optax.Schedule:
    """Linear warmup from 0 to the peak, then decay to `end_learning_rate` at `total_steps`.

    Unlike google-research/bert (whose linear decay starts at step 0 and is overridden during
    warmup, so it peaks slightly below `learning_rate`), the decay starts at the peak.
    """
    if config.decay in WSD_DECAYS:
        return warmup_stable_decay(config)
    peak, end = config.learning_rate, config.end_learning_rate
    decay_steps = max(config.total_steps - config.warmup_steps, 1)
    if config.decay == "linear":
        decay = optax.linear_schedule(peak, end, decay_steps)
    elif config.decay == "cosine":
        decay = optax.cosine_decay_schedule(peak, decay_steps, alpha=end / peak)
    else:
        decay = optax.constant_schedule(peak)
    if config.warmup_steps == 0:
        return decay
    warmup = optax.linear_schedule(0.0, peak, config.warmup_steps)
    return optax.join_schedules([warmup, decay], [config.warmup_steps])


def _path_names(path) -> list[str]:
    return [str(getattr(key, "key", getattr(key, "name", getattr(key, "idx", key))))
            for key in path]


def decay_mask(params: Any, untrained: Sequence[str] = ()) -> Any:
    """True for parameters that get weight decay: kernels and embeddings, not norms or biases, and
    not the subtrees named in `untrained` ("encoder/pooler" when no objective trains the pooler:
    decay alone would only shrink it towards zero)."""

    def decays(path, _) -> bool:
        names = _path_names(path)
        joined = "/".join(names)
        if any(joined == prefix or joined.startswith(prefix + "/") for prefix in untrained):
            return False
        if names and names[-1] in NO_DECAY_LEAVES:
            return False
        return not any(NO_DECAY_MODULE.search(name) for name in names[:-1])

    return jax.tree_util.tree_map_with_path(decays, params)


def adapted_mask(params: Any) -> Any:
    """LAMB's layer adaptation (the trust ratio) applies to kernels and embeddings only: You et
    al. exclude biases and LayerNorm parameters, as they do from weight decay."""
    return decay_mask(params)


def scale_by_adam_without_bias_correction(b1: float, b2: float,
                                          eps: float) -> optax.GradientTransformation:
    """m / (sqrt(v) + eps) with raw moments, as BERT's AdamWeightDecayOptimizer.

    optax.scale_by_adam always bias-corrects. The state is optax's ScaleByAdamState, so the
    optimizer state has the same layout with or without correction.
    """

    def init_fn(params):
        return optax.ScaleByAdamState(count=jnp.zeros([], jnp.int32),
                                      mu=optax.tree.zeros_like(params),
                                      nu=optax.tree.zeros_like(params))

    def update_fn(updates, state, params=None):
        del params
        mu = optax.tree.update_moment(updates, state.mu, b1, 1)
        nu = optax.tree.update_moment_per_elem_norm(updates, state.nu, b2, 2)
        updates = jax.tree.map(lambda m, v: m / (jnp.sqrt(v) + eps), mu, nu)
        count = optax.safe_increment(state.count)
        return updates, optax.ScaleByAdamState(count=count, mu=mu, nu=nu)

    return optax.GradientTransformation(init_fn, update_fn)


class LearningRateState(NamedTuple):
    count: jax.Array
    learning_rate: jax.Array  # the rate the latest update applied (0 before the first)


def _initial_rate_state(params) -> LearningRateState:
    del params
    return LearningRateState(count=jnp.zeros([], jnp.int32),
                             learning_rate=jnp.zeros([], jnp.float32))


def scale_by_recorded_schedule(schedule: optax.Schedule) -> optax.GradientTransformation:
    """optax.scale_by_learning_rate(schedule) that also keeps the rate it applied in its state,
    so the train step can report it without knowing the schedule."""

    def update_fn(updates, state, params=None):
        del params
        rate = schedule(state.count)
        updates = jax.tree.map(lambda g: jnp.array(-rate, dtype=g.dtype) * g, updates)
        return updates, LearningRateState(count=optax.safe_increment(state.count),
                                          learning_rate=jnp.asarray(rate, jnp.float32))

    return optax.GradientTransformation(_initial_rate_state, update_fn)


def scale_by_host_rate() -> optax.GradientTransformation:
    """Scales by the rate the host set into the state before the step (`time_budget.BudgetRate`):
    the same state as `scale_by_recorded_schedule`'s, so a checkpoint has the same layout."""

    def update_fn(updates, state, params=None):
        del params
        updates = jax.tree.map(lambda g: jnp.array(-state.learning_rate, dtype=g.dtype) * g,
                               updates)
        return updates, state._replace(count=optax.safe_increment(state.count))

    return optax.GradientTransformation(_initial_rate_state, update_fn)


def applied_learning_rate(opt_state: Any) -> jax.Array:
    """The learning rate of the latest update, read from a `make_optimizer` state."""
    found = [leaf for leaf in jax.tree.leaves(
        opt_state, is_leaf=lambda x: isinstance(x, LearningRateState))
        if isinstance(leaf, LearningRateState)]
    if len(found) != 1:
        raise ValueError(f"expected one LearningRateState in the optimizer state, "
                         f"found {len(found)}: build the optimizer with make_optimizer")
    return found[0].learning_rate


def make_optimizer(config: OptimizerConfig, untrained: Sequence[str] = (), *,
                   host_rate: bool = False) -> optax.GradientTransformation:
    """Clip by global norm, then AdamW, LAMB or StableAdamW with decoupled, masked weight decay.

    The chains mirror optax.adamw / optax.lamb (LAMB's trust ratio masked to kernels and
    embeddings, as in its paper), and AdamW with bias correction is optax.adamw. `untrained`:
    parameter subtrees ("encoder/pooler") that no objective trains, left out of weight decay.
    `host_rate`: the rate is set by the host before each step, not computed from the step count
    (a time budget's schedule, `bertjax.train.time_budget`).
    """
    mask = lambda params: decay_mask(params, untrained)  # noqa: E731
    # Fully decoupled decay is coupled decay with the coefficient divided by the peak: the
    # scheduled rate then multiplies it back to (lr_t / peak) * weight_decay.
    weight_decay = config.weight_decay / (
        config.learning_rate if config.fully_decoupled_weight_decay else 1.0)
    parts = [optax.clip_by_global_norm(config.clip_norm)] if config.clip_norm > 0 else []
    if config.name == "stable_adamw":
        parts.append(scale_by_stable_adam(config.b1, config.b2, config.eps, weight_decay, mask))
    else:
        if config.bias_correction or config.name == "lamb":
            moments = optax.scale_by_adam(b1=config.b1, b2=config.b2, eps=config.eps)
        else:
            moments = scale_by_adam_without_bias_correction(config.b1, config.b2, config.eps)
        parts += [moments, optax.add_decayed_weights(weight_decay, mask=mask)]
    if config.name == "lamb":
        parts.append(optax.masked(optax.scale_by_trust_ratio(), adapted_mask))
    parts.append(scale_by_host_rate() if host_rate
                 else scale_by_recorded_schedule(make_schedule(config)))
    return optax.chain(*parts)
