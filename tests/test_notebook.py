"""launch/colab_tpu.ipynb executed top to bottom on the CPU with its quick settings (nbclient):
it pretrains, fine-tunes, exports, and transformers loads and runs the export."""

import json
import os
import subprocess
import sys

import pytest

from pretrain_runs import CHILD_XLA_FLAGS

pytestmark = pytest.mark.notebook

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOK = os.path.join(REPO, "launch", "colab_tpu.ipynb")


# The kernel is this interpreter (the venv's), whatever else Jupyter would find.
KERNEL = "import runpy; runpy.run_module('ipykernel_launcher', run_name='__main__', alter_sys=True)\n"


def venv_kernel(directory, env: dict) -> str:
    """A kernelspec running this interpreter, whatever else Jupyter would find, in `env`."""
    spec = directory / "kernels" / "bertjax-test"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-c", KERNEL, "-f", "{connection_file}"],
        "env": env, "display_name": "bertjax test", "language": "python"}))
    return "bertjax-test"


def outputs_text(cell) -> str:
    return "".join(o.text for o in cell.get("outputs", []) if o.get("name") == "stdout")


def test_notebook_runs_on_cpu(tmp_path, monkeypatch):
    # The test-all extra's Jupyter client, imported here: the fast tier does not install it.
    import nbformat
    from nbclient import NotebookClient

    workdir = tmp_path / "work"
    # The kernel and the commands it starts inherit this environment: one CPU device (not the
    # suite's 8) and the least backend optimization, as compiling dominates runs this small.
    monkeypatch.setenv("XLA_FLAGS", CHILD_XLA_FLAGS)
    monkeypatch.setenv("BERTJAX_NOTEBOOK_QUICK", "1")
    monkeypatch.setenv("BERTJAX_NOTEBOOK_WORKDIR", str(workdir))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    kernel = venv_kernel(tmp_path / "jupyter", {})
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(notebook)
    assert notebook.metadata.kernelspec.name == "python3"  # what Colab runs it with
    # Run from the checkout, as a user of the repository would; errors raise CellExecutionError.
    NotebookClient(notebook, kernel_name=kernel, timeout=240,
                   resources={"metadata": {"path": REPO}}).execute()

    text = [outputs_text(cell) for cell in notebook.cells if cell.cell_type == "code"]
    everything = "\n".join(text)
    assert "bertjax is already installed: " + os.path.join(REPO, "bertjax") in everything
    assert "1 x cpu (cpu)" in everything
    assert "step 20/20" in everything
    assert os.path.isdir(workdir / "pretrain" / "checkpoints" / "20")
    results = json.loads((workdir / "finetune" / "results.json").read_text())
    assert results["finished"] and 0.0 <= results["eval"]["accuracy"] <= 1.0
    exported = sorted(os.listdir(workdir / "export_hf"))
    assert {"config.json", "model.safetensors", "vocab.txt"} <= set(exported)
    # The last cell's transformers predictions: one line per sentence, labels from the export.
    predictions = text[-1].strip().splitlines()
    assert len(predictions) == 2
    assert all(line.split()[0] in ("positive", "negative") for line in predictions)
    assert not os.path.exists(os.path.join(REPO, "bertjax_colab"))
