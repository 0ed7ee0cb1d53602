"""Ahead-of-time compilation for a TPU slice this machine does not have: the real train step
compiled by libtpu's compiler for a described topology, on a CPU, with its per-chip memory, FLOPs,
a roofline bound on its step time and its collectives (`python -m bertjax.compile`)."""
