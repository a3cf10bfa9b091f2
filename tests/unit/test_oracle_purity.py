"""The oracle is the specification: it must not depend on torch.distributed or triton."""

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

FORBIDDEN = ("torch.distributed", "triton")


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
    return names


def test_oracle_import_closure_has_no_distributed_or_triton():
    """Every paracheck module the oracle loads (and runs) imports neither torch.distributed nor triton."""
    code = textwrap.dedent("""
        import sys, json
        from paracheck.cases import Case
        from paracheck.oracle import train
        from paracheck.workloads import MLPSpec
        train(Case(model=MLPSpec(in_features=3, widths=(2, 1), unused="data", tied=True, buffer=True)))
        print(json.dumps([[m, getattr(sys.modules[m], "__file__", None)] for m in sorted(sys.modules)
                          if m.startswith("paracheck") or m.startswith("triton")]))
    """)
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    import json

    modules = json.loads(out.strip().splitlines()[-1])
    # torch itself may import triton lazily (its compiler stack); the contract is about
    # paracheck's own code, checked statically below over every paracheck module that was loaded.
    modules = [(m, f) for m, f in modules if m.startswith("paracheck")]
    loaded = {m for m, _ in modules}
    assert not loaded & {
        "paracheck.world",
        "paracheck.ddp",
        "paracheck.zero",
        "paracheck.kernels",
    }, loaded
    for name, file in modules:
        bad = [
            i
            for i in _imports(Path(file))
            if any(i == f or i.startswith(f + ".") for f in FORBIDDEN)
            or i in ("torch.distributed",)
            or (i.startswith("torch") and ".distributed" in i)
        ]
        bad += (
            ["from torch import distributed"] if "torch.distributed" in _imports(Path(file)) else []
        )
        assert not bad, f"{name} imports {bad}"


def test_purity_checker_flags_a_distributed_import(tmp_path):
    """The static check above is not vacuous: it sees an import of torch.distributed."""
    p = tmp_path / "m.py"
    p.write_text("import torch.distributed as dist\nfrom triton import jit\n")
    found = _imports(p)
    assert "torch.distributed" in found and "triton" in found
