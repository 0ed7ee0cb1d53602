"""BERT-base on one TPU v5e-8 VM (v5litepod-8): 8 chips of 16 GiB HBM, one host.

bf16 matmuls with fp32 master parameters, plain data parallelism, the paper's global batch of
256: 32 sequences per chip, which keeps the 512-token phase well inside 16 GiB without remat.

    launch/tpu_vm.sh --name=bert --zone=us-west4-a --type=v5litepod-8 \
        --version=v2-alpha-tpuv5-lite -- \
        --config=configs/tpu_v5e_8.py --workdir=DIR --config.data.input='corpus/*.txt'
"""

from configs import base


def get_config():
    config = base.get_config()
    config.model.dtype = "bfloat16"  # parameters stay float32 (base)
    # The rest is base's: the global batch of 256, data parallel over every device.
    return config
