"""Which JAX platforms a bertjax process may start: never libtpu on a machine without TPU chips,
nor a GPU plugin without its GPU.

JAX tries every backend it can load, and with libtpu installed (the `tpu` extra, which
`python -m bertjax.compile` compiles with) that includes the TPU, even where no TPU chip is
attached. libtpu then starts, fails, and can print its start-up warnings on stderr ("Failed to
find host bounds for accelerator type ...", "unexpected worker hostname ..."), which breaks a
command's one-line refusal. So a process that was not told its platforms (JAX_PLATFORMS unset),
on a machine with libtpu installed and no TPU chip attached, is kept to the platforms it has:
the CPU, and a GPU whose device and JAX plugin are both present (a GPU plugin without its GPU
prints its failed CUDA check the same way). `python -m bertjax.compile` loads libtpu (or the
CUDA plugin) by itself for its compile-only devices, which this does not touch.

A TPU chip counts as attached when a Google PCI device (vendor 0x1ae0) other than a disk or a
network card is present (how JAX itself finds TPU chips, without its table of device ids, so a
new TPU generation is never mistaken for none), or a /dev/accel* node exists.

JAX_PLATFORMS and XLA_FLAGS, which JAX and XLA read when their backends start, are checked here
at a command's start: a value they cannot use otherwise ends the command later with a traceback
(an unknown platform) or an abort (XLA takes a value not starting `--` for a file of flags).
"""

from __future__ import annotations

import importlib.util
import os
import pkgutil
import sys
from pathlib import Path

from bertjax.core.errors import UserError

_GOOGLE_PCI_VENDOR = "0x1ae0"
# PCI class prefixes of mass-storage and network controllers: Google's disks and NICs on GCE.
_NOT_ACCELERATORS = ("0x01", "0x02")
# A JAX GPU plugin package's name prefix, the platform it registers, and the device node that
# shows its hardware is there (as JAX checks for CUDA before starting it).
_GPU_PLUGINS = (("xla_cuda", "cuda", ("nvidia0", "nvidiactl", "dxg")), ("xla_rocm", "rocm", ("kfd",)))
# The platform names JAX_PLATFORMS may list ("gpu" is JAX's alias for cuda or rocm).
JAX_PLATFORM_NAMES = ("cpu", "gpu", "cuda", "rocm", "tpu")


def tpu_chips_attached(pci_devices: str = "/sys/bus/pci/devices", dev: str = "/dev") -> bool:
    """Whether a TPU chip may be attached (erring towards yes)."""
    for device in Path(pci_devices).glob("*"):
        try:
            vendor = (device / "vendor").read_text().strip()
            device_class = (device / "class").read_text().strip()
        except OSError:
            continue
        if vendor == _GOOGLE_PCI_VENDOR and not device_class.startswith(_NOT_ACCELERATORS):
            return True
    return any(Path(dev).glob("accel*"))


def libtpu_installed() -> bool:
    return importlib.util.find_spec("libtpu") is not None


def _gpu_plugins(dev: str) -> list[tuple[str, bool]]:
    """(platform, whether its hardware is there) of each JAX GPU plugin installed."""
    spec = importlib.util.find_spec("jax_plugins")
    installed = [m.name for m in pkgutil.iter_modules(spec.submodule_search_locations)] if (
        spec and spec.submodule_search_locations) else []
    return [(platform, any(Path(dev, node).exists() for node in nodes))
            for prefix, platform, nodes in _GPU_PLUGINS
            if any(name.startswith(prefix) for name in installed)]


def platforms_present(pci_devices: str = "/sys/bus/pci/devices",
                      dev: str = "/dev") -> str | None:
    """The JAX platforms to keep this process to ("cpu", "cuda,cpu", ...), or None to leave JAX
    its own choice: when JAX_PLATFORMS is set, a TPU chip may be attached (a TPU VM), or no
    accelerator plugin is installed without its hardware."""
    if _jax_platforms_setting() or tpu_chips_attached(pci_devices, dev):
        return None
    gpus = _gpu_plugins(dev)
    if not libtpu_installed() and all(present for _, present in gpus):
        return None
    return ",".join([*(platform for platform, present in gpus if present), "cpu"])


def _jax_platforms_setting() -> str:
    """JAX_PLATFORMS checked: empty (JAX chooses) or a comma-separated list of known platforms."""
    raw = os.environ.get("JAX_PLATFORMS", "")
    names = [name.strip().lower() for name in raw.split(",")] if raw.strip() else []
    if any(name not in JAX_PLATFORM_NAMES for name in names):
        raise UserError(f"JAX_PLATFORMS={raw!r} must be empty or a comma-separated list of "
                        f"{', '.join(JAX_PLATFORM_NAMES)}")
    return raw.strip()


def check_xla_flags() -> None:
    """XLA_FLAGS must be empty, flags each starting `--`, or the name of a file of flags (how XLA
    reads a value not starting `--`); whether XLA knows each flag's name XLA alone says."""
    raw = os.environ.get("XLA_FLAGS", "")
    if not raw.strip() or raw.lstrip().startswith("--") or os.path.isfile(raw.strip()):
        return
    raise UserError(f"XLA_FLAGS={raw!r} must be empty, flags each starting --, or the name of "
                    "a file of flags")


def keep_off_absent_accelerators() -> None:
    """Keeps this process's JAX off accelerators whose hardware is absent (a command's start).
    Before JAX is imported this sets JAX_PLATFORMS, which JAX reads at import (a command that
    refuses its input before importing JAX stays quick) and a child process on the same machine
    inherits with the same answer; after, JAX's own setting, which holds until its backends
    start."""
    check_xla_flags()
    platforms = platforms_present()
    if platforms is None:
        return
    jax = sys.modules.get("jax")
    if jax is None:
        os.environ["JAX_PLATFORMS"] = platforms
    elif not jax.config.jax_platforms:
        jax.config.update("jax_platforms", platforms)
