"""One CPU host (a laptop or workstation): fp32, data parallel over the host's devices.

CPUs have no fast bfloat16 matmuls, so compute stays fp32. BERT-base would take days per thousand
steps here, so this trains the `mini` size (L=4, H=256) with the BERT recipe's other settings.
XLA sees one CPU device unless told otherwise (XLA_FLAGS=--xla_force_host_platform_device_count=N).

    python -m bertjax.main --config=configs/cpu.py --workdir=DIR --config.data.input='corpus/*.txt'
"""

from configs import base


def get_config():
    config = base.get_config()
    config.model.preset = "mini"
    config.train.batch_size = 32  # fp32 and data parallel: base's
    return config
