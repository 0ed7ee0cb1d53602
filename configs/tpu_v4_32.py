"""BERT-base on a TPU v4-32 pod slice: 16 chips of 32 GiB HBM on 4 hosts (4 JAX processes).

bf16 matmuls with fp32 master parameters. The global batch is 1,024 (64 sequences per chip, as
on a v4-8) for a quarter of the steps, so the run sees the same 256M sequences as the paper's;
the peak learning rate grows by sqrt(4) with the batch. Parameters and Adam moments are sharded
4 ways (fsdp=4, over the fast ICI links) and the batch 16 ways (data=4 x fsdp=4): the same
config then also fits BERT-large (--config.model.preset=large) at 512 tokens.

Every host runs the same command (launch/tpu_vm.sh does); the workdir must be on a file system
all 4 hosts mount at the same path.

    launch/tpu_vm.sh --name=bert --zone=us-central2-b --type=v4-32 -- \
        --config=configs/tpu_v4_32.py --workdir=/mnt/shared/DIR \
        --config.data.input='/mnt/shared/corpus/*.txt'
"""

from configs import base


def get_config():
    config = base.get_config()
    config.model.dtype = "bfloat16"
    config.train.batch_size = 1024
    config.train.steps = 250_000
    config.train.checkpoint_every = 2_500
    config.train.eval_every = 2_500
    config.optimizer.learning_rate = 2e-4
    config.optimizer.warmup_steps = 2_500
    config.mesh.fsdp = 4  # data: the remaining 4 ways (base's -1)
    return config
