"""Benchmark of the pretraining step: `python -m bertjax.bench --config=configs/base.py`.

flops.py holds the FLOP formula and the peak table, jax_step.py our step, torch_peer.py the
transformers peer, cli.py the command line.
"""
