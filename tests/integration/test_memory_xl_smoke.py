"""scripts/memory_xl.py runs end to end on CPU (gloo, a tiny LM) and its analytic state matches."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


# Ten designs, each in fresh gloo ranks: 26 s on the shared 2-core machine.
@pytest.mark.slow(reason="slow (ten designs, fresh ranks each): run with -m slow")
def test_memory_script_smoke_on_cpu(tmp_path):
    """Two gloo ranks, every design: the table comes out and every rank holds exactly the optimizer
    state bytes that paracheck.accounting.memory.training_memory predicts (last column 'yes')."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OUT": str(tmp_path)}
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "memory_xl.py"),
            "--size",
            "tiny",
            "--device",
            "cpu",
            "--context",
            "16",
            "--batch",
            "2",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [
        line for line in proc.stdout.splitlines() if line.startswith("| ") and "---" not in line
    ][1:]
    designs = {(r.split("|")[1].strip(), r.split("|")[2].strip()) for r in rows}
    assert designs == {
        (d, str(k)) for d in ("ddp", "sharded", "zero1", "torch-ddp", "torch-zero") for k in (0, 1)
    }
    assert all(r.rstrip(" |").endswith("yes") for r in rows), proc.stdout
    assert (tmp_path / "memory_xl.md").read_text().strip().endswith(rows[-1].strip())
