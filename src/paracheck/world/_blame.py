"""Inside a rank process: whose objects a library raised on, read from the frames of the exception
a job raised (Note [Raised on the target's objects]). Private to ``paracheck.world``.

Note [Raised on the target's objects]
    paracheck's rank program hands the target's objects to torch: it builds an LR scheduler on the
    target's optimizer, unscales its gradients with a GradScaler, calls the target's module. When
    torch raises there, no frame of the traceback is the user's, and the report read it as
    paracheck's harness raising, though torch raised on what the target gave it (a sharded
    optimizer whose ``param_groups`` lack ``'lr'``: ``KeyError: 'lr'`` in
    ``torch.optim.lr_scheduler``). The frames' values say whose objects they were, and only the
    rank has them: ``blame`` finds the first library frame paracheck's harness called after its
    last own frame and, among its arguments (and one level into the attributes of a library
    object among them, a scheduler's optimizer), an object of a class of the user's code. It says
    so in one sentence that travels with the rank's traceback (``RankFailure.called_on``), and
    for a ``KeyError`` on a key that groups of the object's ``param_groups`` lack, which key and
    which groups. Where every argument is paracheck's or torch's own, it says nothing: then
    paracheck's harness did raise.
"""

from __future__ import annotations

import sys
from types import TracebackType

from paracheck.world._failures import frame_kind

__all__ = ["blame"]


def _class_kind(obj) -> str:
    """The frame kind (``frame_kind``) of the file that defines ``obj``'s class: its module's,
    or (a module loaded from a file and not registered) that of one of its functions."""
    cls = type(obj)
    if cls.__module__ == "builtins":
        return "library"
    module = sys.modules.get(cls.__module__)
    path = getattr(module, "__file__", None) if module is not None else None
    if path is None:
        code = next((v.__code__ for v in vars(cls).values() if hasattr(v, "__code__")), None)
        path = code.co_filename if code is not None else None
    return "library" if path is None else frame_kind(path)


def _target_objects(values: dict) -> list[tuple[str, object]]:
    """(name, object) of the objects of the user's code among ``values`` (a frame's arguments by
    name), then among the attributes of the library objects there (a scheduler's optimizer)."""
    direct = [(name, v) for name, v in values.items() if _class_kind(v) == "user"]
    inner = [
        (attr, a)
        for v in values.values()
        if _class_kind(v) == "library"
        for attr, a in list(getattr(v, "__dict__", {}).items())[:64]
        if not attr.startswith("__") and _class_kind(a) == "user"
    ]
    return direct + inner


def _missing_group_key(exc: BaseException, obj) -> str | None:
    """For ``KeyError(key)``: "param_groups lack 'key' (groups i, j)" where groups of ``obj``'s
    ``param_groups`` lack it."""
    if not isinstance(exc, KeyError) or len(exc.args) != 1 or not isinstance(exc.args[0], str):
        return None
    key = exc.args[0]
    groups = getattr(obj, "param_groups", None)
    if not isinstance(groups, list):
        return None
    lacking = [i for i, g in enumerate(groups) if isinstance(g, dict) and key not in g]
    if not lacking:
        return None
    which = f"group {lacking[0]}" if len(lacking) == 1 else "groups " + ", ".join(map(str, lacking))
    return f"param_groups lack {key!r} ({which} of {len(groups)})"


def blame(exc: BaseException) -> str | None:
    """One sentence where ``exc`` was raised in a library (torch) that paracheck's harness called
    on an object of the user's code, naming the object; None otherwise (Note [Raised on the
    target's objects])."""
    frames = []
    tb: TracebackType | None = exc.__traceback__
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    kinds = [frame_kind(f.f_code.co_filename) for f in frames]
    if "harness" not in kinds:
        return None
    last = len(kinds) - 1 - kinds[::-1].index("harness")
    after = kinds[last + 1 :]
    if not after:
        # Raised in paracheck's own code: the target's only where it read a key every optimizer's
        # param_groups hold and the target's lack (an LR schedule reading 'lr').
        arguments, function = _called(frames[last])
        lacking = _lacking(exc, arguments)
        return lacking and f"{lacking}, which paracheck reads ({function}) as torch does"
    if "user" in after:
        return None  # raised in the user's code (its frames say where)
    frame = frames[last + 1]
    library = str(frame.f_globals.get("__name__", "a library"))
    arguments, function = _called(frame)
    lacking = _lacking(exc, arguments)
    if lacking is not None:
        return f"{lacking}, which {library} reads ({function})"
    for what, obj in _target_objects(arguments)[:1]:
        return (
            f"{library} raised in {function}, called by paracheck on the target's {what} "
            f"({type(obj).__name__})"
        )
    return None


def _called(frame) -> tuple[dict, str]:
    """``frame``'s arguments by name, and its function's name."""
    code = frame.f_code
    count = code.co_argcount + code.co_kwonlyargcount
    arguments = {name: frame.f_locals.get(name) for name in code.co_varnames[:count]}
    return arguments, getattr(code, "co_qualname", code.co_name)


def _lacking(exc: BaseException, arguments: dict) -> str | None:
    """ "the target's optimizer (Cls) param_groups lack 'key' (...)" for the first object of the
    target's among ``arguments`` whose groups lack the key of ``exc`` (a KeyError); else None."""
    for what, obj in _target_objects(arguments):
        missing = _missing_group_key(exc, obj)
        if missing is not None:
            return f"the target's {what} ({type(obj).__name__}) {missing}"
    return None
