"""Benchmark of the pretraining step: `python -m bertjax.bench --config=configs/base.py`.

flops.py holds the FLOP formula and the peak table, jax_step.py our step, torch_peer.py the
transformers peer, finetune_epoch.py an epoch of fine-tuning against transformers';
`bertjax.cli.bench` is the command line.
"""
