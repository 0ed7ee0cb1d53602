"""benchmarks/tlm_retrieval.py end to end at the smallest budget: the two Debian Bibles fetched
(system packages), one corpus prepared, an MLM run and an MLM + TLM run of the real job, and the
retrieval table printed with a row for each, every figure a rate in [0, 1]."""

import os
import re
import subprocess
import sys

import pytest

from pretrain_runs import REPO, child_env

pytestmark = [pytest.mark.system_packages, pytest.mark.slow]


def test_the_benchmark_prints_the_retrieval_table_of_both_objectives(tmp_path):
    result = subprocess.run(
        [sys.executable, os.path.join(REPO, "benchmarks", "tlm_retrieval.py"), "--steps", "2",
         "--seq-len", "32", "--batch-size", "8", "--pairs", "40", "--vocab-size", "1000",
         "--workdir", str(tmp_path)], env=child_env(), cwd=REPO, capture_output=True, text=True,
        timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = {line.split("|")[1].strip(): line for line in result.stdout.splitlines()
            if line.startswith("| MLM")}
    assert set(rows) == {"MLM", "MLM + TLM"}, result.stdout
    for name, line in rows.items():
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        assert cells[1] == ("0" if name == "MLM" else "0.5")
        rates = [float(cell) for cell in cells[2:6]]
        assert all(0.0 <= rate <= 1.0 for rate in rates), line
    assert re.search(r"40 held-out verse pairs \(chance 0\.025\)", result.stdout), result.stdout
