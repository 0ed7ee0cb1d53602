"""Compile-only CUDA devices: one node of H100 or H200 GPUs described to the CUDA PJRT plugin (the
gpu-compile extra), which compiles for them with no GPU and no CUDA driver on the machine.

The plugin makes such a topology from two options: `target_config`, XLA's GpuTargetConfigProto
as text (what the compiler reads of the GPU: compute capability, cores, shared memory, HBM, ...),
and `topology`, "partitions x hosts x GPUs a host". The figures below are XLA's own GPU specs
(openxla/xla, xla/backends/gpu/target_config/specs/h100_sxm.txtpb and h200.txtpb, Apache-2.0),
less the field jax 0.10's plugin does not know (collective_memory_granularity).
"""

from __future__ import annotations

import jax
from jax.experimental import topologies

from bertjax.core import extras
from bertjax.core.errors import UserError

# What differs between the two (everything else in XLA's two specs is the same).
_MODELS = {
    "h100": {"name": "NVIDIA H100 80GB HBM3", "memory_bandwidth": 3352320000000,
             "device_memory_size": 84942979072, "mem_clock_khz": 2619000, "dnn": (8, 9, 4)},
    "h200": {"name": "NVIDIA H200 141GB HBM3e", "memory_bandwidth": 4800000000000,
             "device_memory_size": 151397597184, "mem_clock_khz": 3750000, "dnn": (9, 10, 0)},
}
_CLOCK, _TENSOR_CLOCK = 1.98, 1.8295201
# Throughput a core, per data type (xla.PrimitiveType's number): (clock GHz, units, ops a clock).
_SCALAR_UNITS = {4: (_CLOCK, 64, 1), 8: (_CLOCK, 64, 1), 10: (_CLOCK, 128, 2),
                 11: (_CLOCK, 128, 1), 12: (_CLOCK, 64, 1), 16: (_CLOCK, 128, 2)}
_MATRIX_UNITS = {2: 1024, 6: 1024, 10: 512, 11: 256, 16: 512, 19: 1024, 20: 1024, 23: 1024,
                 24: 1024, 25: 1024, 28: 1024, 29: 1024, 33: 1024, 35: 1024, 36: 1024}


def _rates(name: str, units: dict) -> str:
    entries = "".join(
        f"    rate_infos {{ key: {key} value {{ clock_rate_ghz: {clock} units_per_core: {count} "
        f"ops_per_clock: {ops} }} }}\n" for key, (clock, count, ops) in units.items())
    return f"  {name} {{\n{entries}  }}\n"


def target_config(family: str) -> str:
    """The GpuTargetConfigProto (text format) of one GPU of `family` (h100, h200)."""
    m = _MODELS[family]
    matrix = {key: (_TENSOR_CLOCK, 4, ops) for key, ops in _MATRIX_UNITS.items()}
    matrix[12] = (_CLOCK, 4, 32)
    model_str = (f"sm_9.0a with {m['device_memory_size']}B RAM, 132 cores, 1980000KHz clock, "
                 f"{m['mem_clock_khz']}KHz mem clock, 52428800B L2$")
    major, minor, patch = m["dnn"]
    return (
        "gpu_device_info {\n"
        "  threads_per_block_limit: 1024 threads_per_warp: 32 shared_memory_per_block: 49152\n"
        "  shared_memory_per_core: 233472 threads_per_core_limit: 2048 core_count: 132\n"
        "  fpus_per_core: 128 block_dim_limit_x: 2147483647 block_dim_limit_y: 65535\n"
        "  block_dim_limit_z: 65535 l2_cache_size: 52428800 clock_rate_ghz: 1.98\n"
        f"  memory_bandwidth: {m['memory_bandwidth']}\n"
        f"  device_memory_size: {m['device_memory_size']}\n"
        "  shared_memory_per_block_optin: 232448\n"
        "  cuda_compute_capability { major: 9 feature_extension: ACCELERATED_FEATURES }\n"
        "  registers_per_core_limit: 65536 registers_per_block_limit: 65536\n"
        + _rates("scalar_unit_description", _SCALAR_UNITS)
        + _rates("matrix_unit_description", matrix)
        + "  thread_dim_limit_x: 1024 thread_dim_limit_y: 1024 thread_dim_limit_z: 64\n"
        '  device_vendor: "NVIDIA Corporation" platform_version: "Compute Capability 9.0a"\n'
        f'  model_str: "{model_str}"\n'
        "  device_address_bits: 64 pcie_bandwidth: 34359738368 ecc_enabled: true\n"
        f'  name: "{m["name"]}"\n'
        '  driver_version: "13.0.0" runtime_version: "12.8.0"\n'
        '  compile_time_toolkit_version: "12.8.0" dnn_version: "9.10.0" cub_version: "3.1.2"\n'
        "  device_interconnect_info { active_links: 18 }\n"
        "}\n"
        'platform_name: "CUDA"\n'
        f"dnn_version_info {{ major: {major} minor: {minor} patch: {patch} }}\n"
        f'device_description_str: "{m["name"]}"\n')


def devices(name: str, family: str, count: int, num_nodes: int = 1) -> list:
    """The CUDA plugin's compile-only devices of one node of `count` GPUs of `family`."""
    # jax discovers the plugin (jax_plugins.xla_cuda12) itself; importing it only checks it is there
    extras.require("jax_plugins.xla_cuda12", "gpu-compile", "compiling for a GPU node")
    if num_nodes != 1:
        raise UserError(f"--num-slices is for TPU slices; {name} is one node of GPUs, "
                        f"got --num-slices={num_nodes}")
    # JAX stays on the CPU (nothing runs on the described GPUs), and the plugin then skips its
    # check for CUDA libraries, which a machine without a GPU lacks.
    if not jax.config.jax_platforms:
        jax.config.update("jax_platforms", "cpu")
    description = topologies.get_topology_desc(platform="cuda", topology=f"1x1x{count}",
                                               target_config=target_config(family))
    found = list(description.devices)
    if len(found) != count:
        raise UserError(f"the CUDA plugin describes {len(found)} devices for {name}, "
                        f"expected {count}")
    return found
