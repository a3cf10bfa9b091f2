"""Throwaway clones of paracheck's own repository for gate runs: the working tree committed as
``base``, and commits that append a patch to one module."""

import os
import shutil
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GIT = [
    "git",
    "-c",
    "user.name=gate test",
    "-c",
    "user.email=gate-test@localhost",
    "-c",
    "commit.gpgsign=false",
]

# One extra full-size gradient buffer, allocated at construction and kept: every peak from init
# on grows by the model's trainable elements.
FAT_PATCH = """
import functools as _gate_test_functools

import torch as _gate_test_torch

_gate_test_init = {cls}.__init__


@_gate_test_functools.wraps(_gate_test_init)  # keeps the signature paracheck reads
def _gate_test_fat_init(self, module, *args, **kwargs):
    _gate_test_init(self, module, *args, **kwargs)
    trainable = [p for p in module.parameters() if p.requires_grad]
    self._gate_test_grad_copy = _gate_test_torch.zeros(
        sum(p.numel() for p in trainable), dtype=trainable[0].dtype, device=trainable[0].device
    )


{cls}.__init__ = _gate_test_fat_init
"""


def _run(cmd, cwd) -> str:
    return subprocess.run(cmd, cwd=cwd, check=True, capture_output=True, text=True).stdout


def has_commit(sha: str) -> bool:
    """Whether this checkout has ``sha`` (a shallow clone may not)."""
    return (
        subprocess.run(
            ["git", "-C", ROOT, "cat-file", "-e", f"{sha}^{{commit}}"], capture_output=True
        ).returncode
        == 0
    )


def paracheck_clone(tmp: str) -> tuple[str, str]:
    """A clone of this repository with its working tree (tracked and untracked, not ignored)
    committed on top, checked out detached. Returns the clone's path and that commit."""
    repo = os.path.join(tmp, "repo")
    _run(["git", "clone", "-q", "--no-hardlinks", ROOT, repo], cwd=tmp)
    files = _run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT).split("\0")
    tracked = set(_run(["git", "ls-files", "-z"], cwd=repo).split("\0")) - {""}
    present = {f for f in files if f and os.path.isfile(os.path.join(ROOT, f))}
    for f in tracked - present:
        os.remove(os.path.join(repo, f))
    for f in present:
        os.makedirs(os.path.dirname(os.path.join(repo, f)) or repo, exist_ok=True)
        shutil.copy2(os.path.join(ROOT, f), os.path.join(repo, f))
    _run(GIT + ["add", "-A"], cwd=repo)
    _run(GIT + ["commit", "-q", "--allow-empty", "-m", "base: the working tree"], cwd=repo)
    base = _run(["git", "rev-parse", "HEAD"], cwd=repo).strip()
    _run(["git", "checkout", "-q", "--detach", base], cwd=repo)
    return repo, base


def commit_patch(repo: str, parent: str, module: str, text: str) -> str:
    """A commit on ``parent`` that appends ``text`` to ``module``'s file; returns its sha and
    leaves ``parent`` checked out."""
    _run(["git", "checkout", "-q", "--detach", parent], cwd=repo)
    with open(os.path.join(repo, "src", *module.split(".")) + ".py", "a") as f:
        f.write(text)
    _run(GIT + ["commit", "-q", "-am", f"patch {module}"], cwd=repo)
    sha = _run(["git", "rev-parse", "HEAD"], cwd=repo).strip()
    _run(["git", "checkout", "-q", "--detach", parent], cwd=repo)
    return sha
