"""How hard XLA optimizes what a test compiles.

Most tests compile far more than they run: a step they run once or twice, an initialization they
run once. For those, XLA's least optimization (JAX's `jax_disable_most_optimizations`: LLVM -O0,
its expensive passes off) is the cheaper bargain: a tiny fine-tuning run of a few steps compiles
in about half the time. A test that trains for a hundred steps or more pays the optimization back
(a 125-step run used less than half the CPU optimized). Such tests, and the fixtures that train
that long, are marked `optimized`: they compile as a user's run does. So are the libtpu compile
tests, whose reports (memory, FLOPs) must be those of the programs a user's
`python -m bertjax.compile` builds.

The setting is read at each compilation and is part of the persistent cache's key, so the two
kinds never share an entry. A program a worker already compiled the other way in memory is reused
as it is: the same computation, at most a few ulps apart.
"""

import contextlib

import jax

MARK = "optimized"
_SETTING = "jax_disable_most_optimizations"


def set_default() -> None:
    """Unoptimized, for every test not marked (called once, from conftest)."""
    jax.config.update(_SETTING, True)


@contextlib.contextmanager
def compiled(optimized: bool):
    """Compiles what runs inside optimized (as a user's run is) or not, then restores the setting
    in force before."""
    previous = jax.config.read(_SETTING)
    jax.config.update(_SETTING, not optimized)
    try:
        yield
    finally:
        jax.config.update(_SETTING, previous)
