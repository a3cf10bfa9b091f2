"""Where a measurement was taken: the host, the software and the commit of the measuring code,
recorded next to every ``--json`` measurement."""

from __future__ import annotations

import os
import platform
import time

__all__ = ["machine_info"]


def _commit() -> str | None:
    """The git commit of the paracheck that measures (None outside a git checkout); ``-dirty``
    appended when its working tree has changes."""
    import subprocess

    here = os.path.dirname(os.path.abspath(__file__))
    try:
        sha = subprocess.run(
            ["git", "-C", here, "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10
        )
        if sha.returncode != 0:
            return None
        dirty = subprocess.run(
            ["git", "-C", here, "status", "--porcelain", "--untracked-files=no", "--", "."],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return sha.stdout.strip() + ("-dirty" if dirty else "")


def machine_info(device: str) -> dict:
    """The host, Python, torch, CPUs, device (and GPU), time and ``_commit()`` of a measurement."""
    import torch

    info = {
        "host": platform.node(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cpus": os.cpu_count(),
        "device": device,
        "time": time.strftime("%Y-%m-%d %H:%M:%S"),
        "commit": _commit(),
    }
    if device == "cuda" and torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
        info["gpus"] = torch.cuda.device_count()
    return info
