"""Loading user code: a target, a hook or a rank program named by import path, in the driver and
in the ranks alike.

An import path is ``package.module:Name`` or ``path/to/file.py:Name`` (the file is imported by
location, with its directory, or its package's root, on ``sys.path``; the ranks do the same).
Importing a user's module is guarded (Note [Importing a target]): what would end or stall the
check without a verdict becomes a ``TargetError``.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.util
import os
import signal
import sys
import threading

from paracheck.errors import ExitAtImport, ImportTimeout, TargetError

__all__ = [
    "IMPORT_SECONDS",
    "ExitAtImport",
    "ImportTimeout",
    "TargetError",
    "guarded_import",
    "import_module",
    "is_file_spec",
    "load_object",
]


def is_file_spec(module: str) -> bool:
    return module.endswith(".py") or "/" in module or os.sep in module


def _import_file(spec: str):
    """Import the .py file ``spec``: as ``package.module`` when it lies in a package (so its
    relative imports work), else by location; its directory, or its package's root, goes on
    ``sys.path`` so that its own imports of neighbouring modules work, here and in the ranks, and
    so does the working directory, last."""
    path = os.path.abspath(spec)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no such file: {path}")
    root, parts = os.path.dirname(path), [os.path.splitext(os.path.basename(path))[0]]
    while os.path.isfile(os.path.join(root, "__init__.py")) and os.path.dirname(root) != root:
        parts.insert(0, os.path.basename(root))
        root = os.path.dirname(root)
    if root not in sys.path:
        sys.path.insert(0, root)
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.append(
            os.getcwd()
        )  # the project it belongs to, run from its root (tests/adapters.py)
    if len(parts) > 1:
        dotted = ".".join(parts)
        try:
            mod = importlib.import_module(dotted)
            if os.path.abspath(getattr(mod, "__file__", "") or "") == path:
                return mod
        except ImportError:
            pass  # a package of the same name shadows it: load by location below
    name = f"_paracheck_file_{hashlib.sha1(path.encode()).hexdigest()[:12]}_{parts[-1]}"
    if name in sys.modules:
        return sys.modules[name]
    spec_ = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec_)
    sys.modules[name] = mod
    try:
        spec_.loader.exec_module(mod)
    except BaseException:
        del sys.modules[name]
        raise
    return mod


def import_module(module: str):
    """``package.module`` or ``path/to/file.py`` -> the module (see ``_import_file``). A dotted
    name not found is looked for in the working directory too, as ``python -m`` would (the
    ``paracheck`` script does not put it on ``sys.path``)."""
    if is_file_spec(module):
        return _import_file(module)
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        cwd = os.getcwd()
        if exc.name != module.split(".")[0] or cwd in sys.path or "" in sys.path:
            raise
        sys.path.append(cwd)
        return importlib.import_module(module)


# Note [Importing a target]
#   A target's module runs its top level when imported, in the driver and in every rank. Three
#   things there would end or stall the check without a verdict: ``sys.exit`` (a script that
#   trains at import and exits 0: the driver exited 0 having checked nothing), ``os._exit``, and
#   a top level that never returns (it waits for a process group or for input). While a target
#   is imported, ``os._exit`` raises ``ExitAtImport`` instead, ``SystemExit`` is caught, and,
#   where the import runs in the main thread and nothing else uses SIGALRM, an interval timer
#   raises ``ImportTimeout`` after ``IMPORT_SECONDS``: each becomes a ``TargetError`` naming
#   what the module did. What it prints goes to stderr (stdout may be ``--json -``).
IMPORT_SECONDS = 120.0


@contextlib.contextmanager
def guarded_import(seconds: float | None = None):
    """Note [Importing a target] (``seconds``: ``IMPORT_SECONDS``)."""
    seconds = IMPORT_SECONDS if seconds is None else seconds
    real_exit = os._exit

    def refuse(code):
        raise ExitAtImport(code)

    def expire(signum, frame):
        raise ImportTimeout()

    timed = (
        threading.current_thread() is threading.main_thread()
        and hasattr(signal, "setitimer")
        and signal.getsignal(signal.SIGALRM) in (signal.SIG_DFL, None)
        and signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    )
    os._exit = refuse  # type: ignore[assignment]  # restored below
    if timed:
        previous = signal.signal(signal.SIGALRM, expire)
        signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        os._exit = real_exit
        if timed:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)


def load_object(path: str):
    """The object at ``path`` (``module:name``, ``name`` dotted for a nested attribute), its module
    imported under Note [Importing a target]; a TargetError saying why it cannot be had."""
    module, sep, name = path.rpartition(":")
    if not sep or not module or not name:
        raise TargetError(
            f"target={path!r} must be a built-in name, 'package.module:Class' or 'file.py:Name'"
        )
    try:
        with guarded_import():
            obj = import_module(module)
    except SystemExit as exc:
        raise TargetError(
            f"target={path!r}: importing module {module!r} called sys.exit({exc.code!r}), which "
            f"would end the check having checked nothing; keep a script's work under "
            f'`if __name__ == "__main__":`'
        ) from None
    except ExitAtImport as exc:
        raise TargetError(
            f"target={path!r}: importing module {module!r} called os._exit({exc.code!r}), which "
            f"would end the check having checked nothing; keep a script's work under "
            f'`if __name__ == "__main__":`'
        ) from None
    except ImportTimeout:
        raise TargetError(
            f"target={path!r}: module {module!r} did not finish importing within "
            f"{IMPORT_SECONDS:g} s (does it train, read input or wait for a process group at its "
            f"top level?)"
        ) from None
    except Exception as exc:  # noqa: BLE001 - any import failure is the user's to read
        raise TargetError(
            f"target={path!r}: module {module!r} does not import: {type(exc).__name__}: {exc}"
        ) from exc
    for part in name.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise TargetError(
                f"target={path!r}: module {module!r} has no attribute {part!r}"
            ) from None
    return obj
