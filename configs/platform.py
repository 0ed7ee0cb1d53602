"""BERT pretraining presets, one per platform: `--config=configs/platform.py:NAME`.

Each changes only what differs from base.py. On accelerators matmuls run in bfloat16 while the
parameters stay float32 (softmax, LayerNorm and the losses stay fp32 too); the mesh is plain data
parallelism unless a preset says otherwise. The TPU presets train without attention dropout, so
their attention runs in Pallas's splash kernel (docs/tpu-compile.md#attention-kernels).

  cpu        One CPU host (a laptop or workstation), compute in fp32; BERT-base would take
             days per thousand steps, so this trains the `mini` size (L=4, H=256) with the
             recipe's other settings, batch 32. XLA sees one CPU device unless told otherwise
             (XLA_FLAGS=--xla_force_host_platform_device_count=N).
                 python -m bertjax.main --config=configs/platform.py:cpu --workdir=DIR \
                     --config.data.input='corpus/*.txt'

  cpu_bf16   The same on a CPU with bfloat16 dot-product instructions (AVX512-BF16: AMD Zen 4
             and later, Intel Cooper Lake / Sapphire Rapids and later; `grep avx512_bf16
             /proc/cpuinfo`): the matmuls take bf16 operands into fp32 results
             (model.matmul_dtype), everything else stays fp32, and the layers are unrolled
             (model.scan_layers=False: no per-layer stacking of activations; longer compiles).
             A BERT-base step of 8 x 128 tokens took 2.21 s on a 2-core Zen 4, against 3.98 s
             unrolled and 4.55 s scanned in fp32 (docs/speed.md). Without those instructions it is slower than `cpu`.

  gpu_8      BERT-base on one node of 8 GPUs (A100 / H100), one process driving all eight: the
             paper's global batch of 256, 32 sequences per GPU, data parallel over NVLink. For
             several nodes, submit launch/slurm_gpu.sbatch (one process per node) and scale
             train.batch_size with the node count.
                 python -m bertjax.main --config=configs/platform.py:gpu_8 --workdir=DIR \
                     --config.data.input='corpus/*.txt'

  tpu_v4_8   BERT-base on one TPU v4-8 VM: 4 chips of 32 GiB HBM, one host. 110M parameters
             and their Adam moments fit every chip many times over; batch 256 is 64 a chip. At
             the 512-token phase the activations do not fit 32 GiB (38.6 GiB of temporaries,
             libtpu's compiler), so the layers recompute all but their matmuls' outputs in the
             backward pass (model.remat=save_dots, about 3% more matmul work).
                 launch/tpu_vm.sh --name=bert --zone=us-central2-b --type=v4-8 -- \
                     --config=configs/platform.py:tpu_v4_8 --workdir=DIR \
                     --config.data.input='corpus/*.txt'

  tpu_v5e_8  BERT-base on one TPU v5e-8 VM (v5litepod-8): 8 chips of 16 GiB HBM, one host.
             Batch 256 is 32 a chip; at the 512-token phase with BERT's attention dropout that
             needs 20.1 GiB of temporaries without remat, so the layers keep only their
             matmuls' outputs for the backward pass (model.remat=save_dots): 6.5 GiB a chip in
             all (python -m bertjax.compile --config=configs/platform.py:tpu_v5e_8
             --topology=v5e-8 --config.schedule.long_fraction=1).
                 launch/tpu_vm.sh --name=bert --zone=us-west4-a --type=v5litepod-8 \
                     --version=v2-alpha-tpuv5-lite -- \
                     --config=configs/platform.py:tpu_v5e_8 --workdir=DIR \
                     --config.data.input='corpus/*.txt'

  tpu_v4_32  BERT-base on a TPU v4-32 pod slice: 16 chips of 32 GiB HBM on 4 hosts (4 JAX
             processes). The global batch is 1,024 (64 a chip, as on a v4-8) for a quarter of the
             steps, so the run sees the paper's 256M sequences; the peak learning rate grows by
             sqrt(4) with the batch. Parameters and Adam moments are sharded 4 ways (fsdp=4, over
             the fast ICI links) and the batch 16 ways (data=4 x fsdp=4): the layers keep
             only their matmuls' outputs for the backward pass (model.remat=save_dots; without
             it the 512-token phase needs 37.4 GiB of temporaries a chip). Every host runs
             the same command (launch/tpu_vm.sh does); the workdir must be one all 4 hosts see:
             a bucket (docs/cloud-storage.md) or a file system they mount at the same path.
                 launch/tpu_vm.sh --name=bert --zone=us-central2-b --type=v4-32 -- \
                     --config=configs/platform.py:tpu_v4_32 --workdir=gs://BUCKET/DIR \
                     --config.data.input='gs://BUCKET/corpus/*.txt'
"""

from configs import base

_BF16 = {"model.dtype": "bfloat16"}
# Each layer's activations are recomputed in the backward pass except its matmuls' outputs
# (model.remat=save_dots): without it, the 512-token phase does not fit a TPU chip at 32 or 64
# sequences a chip (python -m bertjax.compile, docs/tpu-compile.md, with BERT's attention dropout:
# v5e-8 needed 20.1 GiB of temporaries for 15.75 available, v4-8 38.6 of 30.75, v4-32 37.4 of
# 30.75); with it and the splash kernel, v5e-8 needs 7.2 GiB in all. The recomputation adds
# about 3% to the step's matmuls.
# No dropout on the attention probabilities (as ModernBERT and MosaicBERT train): the splash
# attention kernel (model.attention_implementation=auto on a TPU) never forms them to drop.
_TPU = {**_BF16, "model.remat": "save_dots", "model.attention_dropout": 0.0}

# name -> the settings that differ from base.py (dotted keys).
PLATFORMS: dict[str, dict] = {
    "cpu": {"model.preset": "mini", "train.batch_size": 32},
    "cpu_bf16": {"model.preset": "mini", "train.batch_size": 32,
                 "model.matmul_dtype": "bfloat16", "model.scan_layers": False},
    "gpu_8": _BF16,
    "tpu_v4_8": _TPU,
    "tpu_v5e_8": _TPU,
    "tpu_v4_32": {**_TPU, "train.batch_size": 1024, "train.steps": 250_000,
                  "train.checkpoint_every": 2_500, "train.eval_every": 2_500,
                  "optimizer.learning_rate": 2e-4, "optimizer.warmup_steps": 2_500,
                  "mesh.fsdp": 4},  # data: the remaining 4 ways (base's -1)
}


def get_config(platform: str | None = None):
    if platform not in PLATFORMS:
        # A KeyError, not a ValueError: config_flags turns the latter into a traceback dump.
        raise KeyError(f"configs/platform.py needs a platform: --config=configs/platform.py:NAME "
                       f"with NAME one of {', '.join(PLATFORMS)}, got {platform!r}")
    config = base.get_config()
    for key, value in PLATFORMS[platform].items():
        section, field = key.split(".")
        config[section][field] = value
    return config
