"""`paracheck check module:Class` checks code written outside paracheck: end to end in a
subprocess (a correct and a broken DDP, a module that does not import), the other diagnoses by the
same command line run in this process on the session's World (a subprocess starts its own ranks:
seconds per command)."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import paracheck.cli.check as cli_check
from paracheck.cli import main
from tests.integration._borrowed import Borrowed

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
            p.grad = None if flag == 0 else g.to(p.dtype, copy=True)
'''

BROKEN = CORRECT.replace("/ self.ws", "")  # forgets to average

NEITHER = """
class NotATarget:
    def __init__(self, a, b, c):
        pass
"""

RAISES = """
class Exploding:
    def __init__(self, module):
        raise RuntimeError("constructor exploded")

    def finish_gradient_synchronization(self):
        pass
"""


def _check(tmp_path, source: str, target: str, *extra: str) -> subprocess.CompletedProcess:
    (tmp_path / "user_impl.py").write_text(textwrap.dedent(source))
    env = dict(os.environ, PYTHONPATH=str(tmp_path) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd = [
        sys.executable,
        "-m",
        "paracheck.cli",
        "check",
        f"user_impl:{target}",
        "--world-sizes",
        "1,2",
        "--max-examples",
        "15",
        "--timeout",
        "10",
        "--budget",
        "0",  # no budget: a pass must not turn INCOMPLETE (exit 3) on a loaded machine
        *extra,
    ]
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
    assert "case (shrunk): W=2 " in out.stdout
    assert "grad '" in out.stdout and "allowed" in out.stdout
    replay = [
        line
        for line in out.stdout.splitlines()
        if line.strip().startswith("replay: ") and "paracheck check user_impl:MyDDP" in line
    ]
    assert replay
    # The replay command reproduces exactly that failure, from the case's file, named by its
    # absolute path (the command runs from any directory).
    case_file = replay[0].split("--case ", 1)[1].strip()
    assert case_file.startswith(str(tmp_path / ".paracheck" / "cases")), replay[0]
    assert '"world_size": 2' in Path(case_file).read_text()
    again = _check(tmp_path, BROKEN, "MyDDP", "--case", case_file)
    assert again.returncode == 1 and "grad '" in again.stdout


def test_class_fitting_no_interface_is_a_usage_error(tmp_path):
    """A class that is neither a DDP wrapper nor a sharded optimizer exits 2 and says why."""
    out = _check(tmp_path, NEITHER, "NotATarget")
    assert out.returncode == 2
    assert "fits neither interface" in out.stderr and "--kind" in out.stderr


def test_missing_module_is_a_usage_error(tmp_path):
    """A target whose module does not import exits 2 naming it."""
    env = dict(os.environ)
    out = subprocess.run(
        [sys.executable, "-m", "paracheck.cli", "check", "no_such_module_xyz:DDP"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert out.returncode == 2 and "no_such_module_xyz" in out.stderr


def test_raising_constructor_is_a_readable_failure(paracheck, tmp_path):
    """A constructor that raises fails the check (exit 1) with the rank's traceback, not a frozen run."""
    from paracheck.check.features import optional_features

    (tmp_path / "user_impl.py").write_text(textwrap.dedent(RAISES))
    # The core row alone: every row's cases raise the same (34 s for the whole table).
    off = ",".join("-" + name for name in optional_features())
    code, stdout, stderr = paracheck("user_impl.py:Exploding", f"--features={off}")
    assert code == 1, stdout + stderr
    assert "constructor exploded" in stdout and "rank 0 raised" in stdout


EXAMPLE_ADAPTERS = os.path.join(
    os.path.dirname(__file__), os.pardir, os.pardir, "examples", "cs336_adapters.py"
)

NOT_IMPLEMENTED_ADAPTERS = '''
from paracheck.ddp import FlatDDP


def get_ddp_individual_parameters(module):
    return FlatDDP(module)


def ddp_individual_parameters_on_after_backward(ddp_model, optimizer):
    ddp_model.finish_gradient_synchronization()


def get_ddp_bucketed(module, bucket_size_mb):
    """Returns a bucketed DDP container."""
    # For example: return DDPBucketed(module, bucket_size_mb)
    raise NotImplementedError


def ddp_bucketed_on_after_backward(ddp_model, optimizer):
    raise NotImplementedError


def get_sharded_optimizer(params, optimizer_cls, **kwargs):
    raise NotImplementedError
'''

SYNCHRONIZES = (
    CORRECT
    + """

class TimedDDP(MyDDP):
    def finish_gradient_synchronization(self):
        torch.cuda.synchronize()
        super().finish_gradient_synchronization()
"""
)

RENAMED = CORRECT.replace("def finish_gradient_synchronization(self)", "def sync_gradients(self)")


@pytest.fixture
def paracheck(world, monkeypatch, tmp_path, capsys):
    """``paracheck check --world-sizes 1,2 --max-examples 6 ARGS...`` in this process, in
    ``tmp_path``, on the session's World: (exit code, stdout, stderr)."""
    monkeypatch.setattr(cli_check, "_make_world", lambda *a: Borrowed(world))
    monkeypatch.chdir(tmp_path)

    def run(*args: str):
        capsys.readouterr()
        # No budget: a pass must not turn INCOMPLETE (exit 3) on a loaded machine.
        argv = ["check", "--world-sizes", "1,2", "--max-examples", "6", "--timeout", "60"]
        argv += ["--budget", "0"]
        try:
            code = main([*argv, "--no-database", *args])
        except SystemExit as exc:  # argparse's own usage errors
            code = exc.code
        out = capsys.readouterr()
        return code, out.out, out.err

    return run


def test_adapters_example_passes_design_by_design(paracheck):
    """--adapters on the example lists every adapter function and passes each design (exit 0),
    under the contract of the interface it implements (each built-in it returns is checked under
    the full one by its own property test; its own design by the test below)."""
    example = os.path.abspath(EXAMPLE_ADAPTERS)
    code, stdout, stderr = paracheck("--adapters", example, "--contract", "cs336")
    assert code == 0, stdout + stderr
    for fn in (
        "get_ddp",
        "ddp_on_after_backward",
        "get_ddp_individual_parameters",
        "get_ddp_bucketed",
        "ddp_bucketed_on_train_batch_start",
        "get_sharded_optimizer",
    ):
        assert any(line.split() == [fn, "implemented"] for line in stdout.splitlines()), stdout
    assert stdout.count("\nPASS ") == 4, stdout


def test_adapters_example_design_of_its_own_passes_the_full_contract(paracheck):
    """The example's own DDP, the one class in it that is not a built-in, passes every row."""
    plain = f"{os.path.abspath(EXAMPLE_ADAPTERS)}:PlainDDP"
    code, stdout, stderr = paracheck(plain, "--finish", "all_reduce_grads")
    assert code == 0, stdout + stderr
    assert "not drawn: --contract" not in stdout, stdout


def test_adapters_not_implemented_are_listed_not_failed(paracheck, tmp_path):
    """Handout stubs raising NotImplementedError are listed as not implemented; the rest passes (exit 0)."""
    (tmp_path / "adapters.py").write_text(NOT_IMPLEMENTED_ADAPTERS)
    # The listing is under test, not the design (a built-in): the CS336 contract's one row.
    code, stdout, stderr = paracheck("--adapters", "adapters.py", "--contract", "cs336")
    assert code == 0, stdout + stderr
    lines = [line.split(None, 1) for line in stdout.splitlines()]
    for fn in ("get_ddp_bucketed", "ddp_bucketed_on_after_backward", "get_sharded_optimizer"):
        assert [fn, "not implemented"] in lines, stdout
    assert "PASS adapters.py:get_ddp_individual_parameters" in stdout
    assert stdout.count("\nPASS ") == 1, stdout


def test_adapters_without_adapter_functions_is_a_usage_error(paracheck, tmp_path):
    """An --adapters file defining none of the functions exits 2 naming it."""
    (tmp_path / "empty_adapters.py").write_text("def unrelated():\n    pass\n")
    code, _, stderr = paracheck("--adapters", "empty_adapters.py")
    assert code == 2 and "--adapters='empty_adapters.py' defines none" in stderr


def test_cuda_synchronize_in_hook_is_diagnosed_then_stubbed(paracheck, tmp_path):
    """torch.cuda.synchronize() in the hook fails with the diagnosis on CPU, and passes with --stub-cuda-timing."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("needs a machine without CUDA")
    (tmp_path / "user_impl.py").write_text(textwrap.dedent(SYNCHRONIZES))
    code, stdout, stderr = paracheck("user_impl.py:TimedDDP")
    assert code == 1, stdout + stderr
    assert "your code calls a CUDA-only API (torch.cuda.synchronize at user_impl.py:" in stdout
    assert "pass --stub-cuda-timing or run with --backend nccl" in stdout
    # With the stubs it runs: the core row shows that (the rest of the table is the DDP's own).
    stubbed = ("--stub-cuda-timing", "--contract", "cs336")
    code, stdout, stderr = paracheck("user_impl.py:TimedDDP", *stubbed)
    assert code == 0, stdout + stderr


def test_renamed_hook_is_named_by_the_error_and_accepted_by_finish(paracheck, tmp_path):
    """A DDP whose hook is sync_gradients() is told to pass --finish sync_gradients (exit 2), and passes with it."""
    (tmp_path / "user_impl.py").write_text(textwrap.dedent(RENAMED))
    code, _, stderr = paracheck("user_impl.py:MyDDP")
    assert code == 2
    assert (
        "has no finish_gradient_synchronization(); it has sync_gradients(): pass --finish sync_gradients"
        in stderr
    )
    named = ("--finish", "sync_gradients", "--contract", "cs336")  # the core row: it is called
    code, stdout, stderr = paracheck("user_impl.py:MyDDP", *named)
    assert code == 0, stdout + stderr
    code, _, stderr = paracheck("user_impl.py:MyDDP", "--finish", "no_such_method")
    assert code == 2 and "--finish='no_such_method'" in stderr


def test_adapters_with_every_design_a_stub_is_a_usage_error(paracheck, tmp_path):
    """An --adapters file whose every function only raises NotImplementedError checks nothing:
    exit 2 naming it, never the pass a CI job would read as "checked"."""
    stubs = "\n\n".join(
        f"def {fn}(*args, **kwargs):\n    raise NotImplementedError\n"
        for fn in ("get_ddp_bucketed", "ddp_bucketed_on_after_backward", "get_sharded_optimizer")
    )
    (tmp_path / "stub_adapters.py").write_text(stubs)
    code, stdout, stderr = paracheck("--adapters", "stub_adapters.py")
    assert code == 2, stdout + stderr
    assert "--adapters='stub_adapters.py': no design is implemented" in stderr
