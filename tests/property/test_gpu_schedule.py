"""On one GPU: the exact communication schedule of each built-in DDP (and torch DDP) with CUDA
tensors equals the one with CPU tensors, event by event, and the device syncs it counts equal
what ``torch.cuda.set_sync_debug_mode("warn")`` reports (Note [Device syncs counted on the CPU]
in paracheck.accounting.schedule). Skipped and counted where no CUDA device exists."""

import importlib.util
import pathlib

import pytest

pytestmark = [pytest.mark.gpu]

SCRIPT = pathlib.Path(__file__).parents[2] / "scripts" / "gpu_schedule.py"


def test_schedule_on_one_gpu_equals_the_cpu_schedule(tmp_path):
    """scripts/gpu_schedule.py: every variant's CPU and CUDA schedules are the same."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    spec = importlib.util.spec_from_file_location("gpu_schedule", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main(["--json", str(tmp_path / "schedule.json")]) == 0
