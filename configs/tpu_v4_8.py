"""BERT-base on one TPU v4-8 VM: 4 chips (JAX devices) of 32 GiB HBM, one host.

bf16 matmuls with fp32 master parameters (softmax, LayerNorm and the losses stay fp32), plain data
parallelism (110M parameters and their Adam moments fit every chip many times over), and the
paper's global batch of 256: 64 sequences per chip.

    launch/tpu_vm.sh --name=bert --zone=us-central2-b --type=v4-8 -- \
        --config=configs/tpu_v4_8.py --workdir=DIR --config.data.input='corpus/*.txt'
"""

from configs import base


def get_config():
    config = base.get_config()
    config.model.dtype = "bfloat16"  # parameters stay float32 (base)
    # The rest is base's: the global batch of 256, data parallel over every device.
    return config
