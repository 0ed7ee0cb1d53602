"""BERT-base on one node of 8 GPUs (A100 / H100), one process driving all eight.

bf16 matmuls with fp32 master parameters, plain data parallelism over NVLink, the paper's global
batch of 256: 32 sequences per GPU. For several nodes, submit launch/slurm_gpu.sbatch (one process
per node) and scale train.batch_size with the node count.

    python -m bertjax.main --config=configs/gpu_8.py --workdir=DIR \
        --config.data.input='corpus/*.txt'
"""

from configs import base


def get_config():
    config = base.get_config()
    config.model.dtype = "bfloat16"  # parameters stay float32 (base)
    # The rest is base's: the global batch of 256, data parallel over every device.
    return config
