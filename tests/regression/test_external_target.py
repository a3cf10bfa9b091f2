"""`paracheck check module:Class` checks code written outside paracheck, end to end (subprocess)."""

import os
import subprocess
import sys
import textwrap

import pytest

CORRECT = '''
import torch
import torch.distributed as dist


class MyDDP(torch.nn.Module):
    """A user's DDP: broadcast at construction, one flat all-reduce (with presence flags) after backward."""

    def __init__(self, module):
        super().__init__()
        self.module = module
        self.ws = dist.get_world_size()
        for t in list(module.parameters()) + list(module.buffers()):
            dist.broadcast(t.data, src=0)

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def finish_gradient_synchronization(self):
        params = [p for p in self.module.parameters() if p.requires_grad]
        if self.ws == 1 or not params:
            return
        flags = [0.0 if p.grad is None else 1.0 for p in params]
        flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params]
                         + [torch.tensor(flags, dtype=params[0].dtype)])
        dist.all_reduce(flat)
        offset = 0
        n = sum(p.numel() for p in params)
        for p, flag in zip(params, flat[n:].tolist()):
            g = flat[offset:offset + p.numel()].view_as(p) / self.ws
            offset += p.numel()
            p.grad = None if flag == 0 else g.clone()
'''

BROKEN = CORRECT.replace("/ self.ws", "")  # forgets to average

NEITHER = '''
class NotATarget:
    def __init__(self, a, b, c):
        pass
'''

RAISES = '''
class Exploding:
    def __init__(self, module):
        raise RuntimeError("constructor exploded")

    def finish_gradient_synchronization(self):
        pass
'''


def _check(tmp_path, source: str, target: str, *extra: str) -> subprocess.CompletedProcess:
    (tmp_path / "user_impl.py").write_text(textwrap.dedent(source))
    env = dict(os.environ, PYTHONPATH=str(tmp_path) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd = [sys.executable, "-m", "paracheck.cli", "check", f"user_impl:{target}", "--world-sizes", "1,2,3",
           "--max-examples", "15", "--timeout", "10", *extra]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)


def test_correct_external_ddp_passes(tmp_path):
    """A correct user DDP outside the package exits 0."""
    out = _check(tmp_path, CORRECT, "MyDDP")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "PASS user_impl:MyDDP" in out.stdout


def test_broken_external_ddp_fails_with_report(tmp_path):
    """A user DDP that forgets to average exits 1 with the shrunk case, the divergence and a replay command."""
    out = _check(tmp_path, BROKEN, "MyDDP")
    assert out.returncode == 1, out.stdout + out.stderr
    assert "shrunk case:" in out.stdout and '"world_size": 2' in out.stdout
    assert "grad '" in out.stdout and "allowed" in out.stdout
    replay = [line for line in out.stdout.splitlines() if line.strip().startswith("paracheck check user_impl:MyDDP")]
    assert replay
    # The replay command reproduces exactly that failure.
    case_json = replay[0].split("--case ", 1)[1].strip().strip("'")
    again = _check(tmp_path, BROKEN, "MyDDP", "--case", case_json)
    assert again.returncode == 1 and "grad '" in again.stdout


def test_class_fitting_no_interface_is_a_usage_error(tmp_path):
    """A class that is neither a DDP wrapper nor a sharded optimizer exits 2 and says why."""
    out = _check(tmp_path, NEITHER, "NotATarget")
    assert out.returncode == 2
    assert "fits neither interface" in out.stderr and "--kind" in out.stderr


def test_missing_module_is_a_usage_error(tmp_path):
    """A target whose module does not import exits 2 naming it."""
    env = dict(os.environ)
    out = subprocess.run([sys.executable, "-m", "paracheck.cli", "check", "no_such_module_xyz:DDP"],
                         capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 2 and "no_such_module_xyz" in out.stderr


def test_raising_constructor_is_a_readable_failure(tmp_path):
    """A constructor that raises fails the check (exit 1) with the rank's traceback, not a frozen run."""
    out = _check(tmp_path, RAISES, "Exploding")
    assert out.returncode == 1, out.stdout + out.stderr
    assert "constructor exploded" in out.stdout and "rank 0 raised" in out.stdout
