"""Diagnoses of rank failures from their traceback text: pure functions of strings.

``cuda_only_call`` recognises a target that calls a CUDA-only API on a machine without CUDA (the
usual case: timing or NVTX annotations left in a DDP's hooks, checked on a laptop), and says
which call, where, and what to do about it. ``cpu_tensor_on_nccl`` recognises the converse: a
collective on a CPU tensor under NCCL (a token count made with ``torch.tensor(n)``, which gloo
reduces and NCCL refuses).
"""

from __future__ import annotations

import os
import re

__all__ = ["cpu_tensor_on_nccl", "cuda_only_call"]

# What torch raises when CUDA is missing (a CPU-only build, no driver, no device).
_CUDA_MISSING = (
    "Torch not compiled with CUDA enabled",
    "Found no NVIDIA driver",
    "CUDA driver",
    "No CUDA GPUs are available",
    "NVTX functions not installed",
    "Tried to instantiate dummy base class",
    "requires CUDA support",
    "has no attribute '_cuda_",
    "CUDA is not available",
    "no CUDA-capable device",
)

_FRAME = re.compile(r'^\s*File "([^"]+)", line (\d+), in (\S+)\s*$')
_API = re.compile(r"\b(?:torch\.)?cuda\.[A-Za-z_][\w.]*|\.cuda\(\)|\.to\(\s*['\"]cuda")
# The torch frame (file suffix, function) a stubbed call fails in, when the user's line does not
# show the call (an alias: `sync = torch.cuda.synchronize`).
_STUBBED_FILES = ("torch/cuda/nvtx.py", "torch/cuda/streams.py")
_STUBBED_APIS = (
    "synchronize",
    "Event",
    "Stream",
    "current_stream",
    "default_stream",
    "stream",
    "nvtx",
    "reset_peak_memory_stats",
    "reset_max_memory_allocated",
)


def _frames(text: str) -> list[tuple[str, int, str, str]]:
    """(file, line, function, source line) of each frame of the last traceback in ``text``."""
    lines = text.splitlines()
    out = []
    for i, line in enumerate(lines):
        m = _FRAME.match(line)
        if m:
            src = (
                lines[i + 1].strip()
                if i + 1 < len(lines) and not _FRAME.match(lines[i + 1])
                else ""
            )
            out.append((m.group(1), int(m.group(2)), m.group(3), src))
    return out


# paracheck's own package directory (its frames are the harness's, not the target's).
_PARACHECK = os.path.dirname(os.path.dirname(os.path.abspath(__file__))).replace("\\", "/") + "/"


def _library(path: str) -> bool:
    p = path.replace("\\", "/")
    if (
        "/torch/" in p
        or p.startswith(_PARACHECK)
        or "/site-packages/paracheck/" in p
        or p.startswith("<")
    ):
        return True
    # The standard library (contextlib's __enter__ between `with nvtx.range(...)` and torch).
    return "/lib/python3" in p and "site-packages" not in p and "dist-packages" not in p


def _called_api(text: str, deeper) -> str:
    """The torch API the target called, from the frames below its own (its line not shown)."""
    dummy = re.search(r"dummy base class (\w+)", text)
    if dummy:
        return f"torch.cuda.{dummy.group(1)}"
    for path, _, function, _ in deeper:
        m = re.search(r"[/\\](torch[/\\].*)\.py$", path)
        if m:
            module = m.group(1).replace("\\", "/").replace("/", ".").removesuffix(".__init__")
            return f"{module}.{function}"
    return "a torch.cuda function"


def cuda_only_call(traceback_text: str) -> str | None:
    """The diagnosis of a rank traceback in which the target's own code calls a CUDA-only API on a
    machine without CUDA, or None (another failure, or a CUDA error raised by paracheck itself)."""
    found = _cuda_call(traceback_text)
    if found is None:
        return None
    api, where, stubbable = found
    if stubbable:
        return (
            f"your code calls a CUDA-only API ({api} at {where}); on CPU pass --stub-cuda-timing or run "
            f"with --backend nccl"
        )
    return (
        f"your code uses CUDA ({api} at {where}) on a machine without it; run with --backend nccl on a "
        f"machine with GPUs"
    )


def stubbable_cuda_call(traceback_text: str) -> bool:
    """Whether the rank traceback is the target's code calling a CUDA timing or NVTX API that
    ``--stub-cuda-timing`` makes a no-op on the ranks."""
    found = _cuda_call(traceback_text)
    return found is not None and found[2]


def _cuda_call(traceback_text: str) -> tuple[str, str, bool] | None:
    """The CUDA-only API the target's own code called, where, and whether the stub covers it."""
    if not any(marker in traceback_text for marker in _CUDA_MISSING):
        return None
    frames = _frames(traceback_text)
    # The innermost frame of the target's code: every frame deeper than it is torch's or Python's.
    user = None
    for k in range(len(frames) - 1, -1, -1):
        if not _library(frames[k][0]):
            user = k
            break
    if user is None or not all(_library(f[0]) for f in frames[user + 1 :]):
        return None
    path, line, _, src = frames[user]
    call = _API.search(src)
    api = call.group(0) if call else None
    if api is not None and not api.startswith("."):
        api = api if api.startswith("torch.") else "torch." + api
    if api is None:
        api = _called_api(traceback_text, frames[user + 1 :])
    where = f"{os.path.basename(path)}:{line}"
    stubbable = any(s in api for s in _STUBBED_APIS) or any(
        f[0].replace("\\", "/").endswith(_STUBBED_FILES) for f in frames[user + 1 :]
    )
    return api, where, stubbable


_CPU_ON_NCCL = "No backend type associated with device type cpu"


def cpu_tensor_on_nccl(traceback_text: str) -> str | None:
    """The diagnosis of a rank traceback in which the target's own code issues a collective on a
    CPU tensor under NCCL, or None."""
    if _CPU_ON_NCCL not in traceback_text:
        return None
    user = [f for f in _frames(traceback_text) if not _library(f[0])]
    where = f" ({user[-1][3] or 'a collective'} at {os.path.basename(user[-1][0])}:{user[-1][1]})"
    return (
        f"your code issues a collective on a CPU tensor under NCCL{where if user else ''}: NCCL "
        f"moves CUDA tensors only; make the tensor on the parameters' device (torch.tensor(n, "
        f"device=p.device)); gloo accepts both, so the same code passes on CPU"
    )
