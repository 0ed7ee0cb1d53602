"""A bertjax process never starts libtpu on a machine without TPU chips (bertjax.core.platforms):
the detection on made-up PCI trees, and, with libtpu installed and a `bertjax.compile` running
beside it, a command whose refusal comes after JAX started prints that one line and nothing of
libtpu's."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bertjax.core import platforms

REPO = Path(__file__).resolve().parent.parent


def pci_tree(root: Path, devices: list[tuple[str, str]]) -> Path:
    """A /sys/bus/pci/devices lookalike: one folder a (vendor, class) pair."""
    for i, (vendor, device_class) in enumerate(devices):
        folder = root / "pci" / f"0000:00:0{i}.0"
        folder.mkdir(parents=True)
        (folder / "vendor").write_text(vendor + "\n")
        (folder / "class").write_text(device_class + "\n")
    (root / "dev").mkdir(exist_ok=True)
    return root / "pci"


@pytest.mark.parametrize("devices, attached", [
    ([("0x8086", "0x060000"), ("0x1af4", "0x020000")], False),  # a plain VM
    ([("0x1ae0", "0x020000"), ("0x1ae0", "0x010802")], False),  # Google's NIC and disk (GCE)
    ([("0x1ae0", "0x020000"), ("0x1ae0", "0x120000")], True),   # and a TPU chip
    ([("0x1ae0", "0xff0000")], True),                            # an unknown Google device
])
def test_tpu_chips_are_found_on_the_pci_bus(tmp_path, devices, attached):
    pci = pci_tree(tmp_path, devices)
    assert platforms.tpu_chips_attached(str(pci), str(tmp_path / "dev")) is attached


def test_an_accel_node_counts_as_a_tpu(tmp_path):
    pci = pci_tree(tmp_path, [("0x8086", "0x060000")])
    (tmp_path / "dev" / "accel0").touch()
    assert platforms.tpu_chips_attached(str(pci), str(tmp_path / "dev"))


def test_the_users_choice_and_a_tpu_machine_keep_jaxs_own_choice(tmp_path, monkeypatch):
    pci = str(pci_tree(tmp_path, [("0x1ae0", "0x120000")]))
    dev = str(tmp_path / "dev")
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    assert platforms.platforms_present(pci, dev) is None
    monkeypatch.delenv("JAX_PLATFORMS")
    monkeypatch.setattr(platforms, "libtpu_installed", lambda: False)
    assert platforms.platforms_present(pci, dev) is None  # JAX cannot start a TPU
    monkeypatch.setattr(platforms, "libtpu_installed", lambda: True)
    monkeypatch.setattr(platforms, "_gpu_plugins", lambda dev: [])
    assert platforms.platforms_present(pci, dev) is None  # a TPU chip: JAX's choice
    plain = str(pci_tree(tmp_path / "vm", [("0x8086", "0x060000")]))
    assert platforms.platforms_present(plain, str(tmp_path / "vm" / "dev")) == "cpu"


def _holds_libtpu(pid: int) -> bool:
    try:
        return "libtpu" in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


@pytest.mark.tpu_compile
def test_a_command_beside_a_compile_prints_nothing_of_libtpus(tmp_path):
    """The user's environment: JAX_PLATFORMS unset (conftest sets it for the suite)."""
    assert platforms.libtpu_installed(), "the tpu extra (make test-all installs it)"
    assert not platforms.tpu_chips_attached(), "a machine without TPU chips"
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    compile_ = subprocess.Popen(
        [sys.executable, "-m", "bertjax.compile", "--config=configs/tiny.py", "--topology=v5e-8"],
        cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while not _holds_libtpu(compile_.pid):  # libtpu loaded: the compile is under way
            assert compile_.poll() is None, "the compile ended before loading libtpu"
            assert time.monotonic() < deadline, "the compile did not load libtpu in 120 s"
            time.sleep(0.2)
        # Refused after JAX has started its backends (the mesh is checked against the devices).
        done = subprocess.run(
            [sys.executable, "-m", "bertjax.main", "--config=configs/tiny.py",
             f"--workdir={tmp_path / 'w'}", "--config.mesh.data=3"],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    finally:
        compile_.kill()
        compile_.wait()
    assert done.returncode == 2, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        "bertjax: error: mesh data=3, fsdp=1, tensor=1 needs 3 devices but there are "), lines
    assert not (tmp_path / "w").exists()


@pytest.mark.parametrize("libtpu, gpus, chosen", [
    (False, [], None),                          # nothing JAX could start in vain
    (False, [("cuda", True)], None),            # a GPU machine: JAX's own choice
    (False, [("cuda", False)], "cpu"),          # the CUDA plugin without a GPU
    (True, [("cuda", True)], "cuda,cpu"),       # libtpu on a GPU machine
    (True, [("cuda", False), ("rocm", False)], "cpu"),
])
def test_only_the_accelerators_present_are_started(tmp_path, monkeypatch, libtpu, gpus, chosen):
    monkeypatch.delenv("JAX_PLATFORMS", raising=False)
    monkeypatch.setattr(platforms, "libtpu_installed", lambda: libtpu)
    monkeypatch.setattr(platforms, "_gpu_plugins", lambda dev: gpus)
    plain = str(pci_tree(tmp_path, [("0x8086", "0x060000")]))
    assert platforms.platforms_present(plain, str(tmp_path / "dev")) == chosen
