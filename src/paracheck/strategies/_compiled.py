"""The DDP and loop kinds' cases with compiled ones among them (Note [Compiled cases] and Note
[Compiled loops] in ``paracheck.cases._compile``): ``cases()`` or ``loop_cases()`` as drawn, and,
drawn last, whether and how the wrapper, or the loop's model or whole step, is compiled."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import strategies as st

from paracheck.cases import COMPILE_SETTINGS
from paracheck.strategies._core import cases
from paracheck.strategies._loop import loop_cases

__all__ = ["compile_settings", "compiled_cases", "compiled_loop_cases"]

# One drawn case in COMPILED_ONE_IN is compiled: the compile row keeps only those (a filter that
# rejects the rest before they run), and every other row removes the feature, so the others cost
# a draw and nothing more. (One in six instead saved 5 s of the first tier's 6 min 29 s and
# changed the derandomised sequences enough that a mutant killed at world sizes 1 and 2 in 40
# cases survived them.)
COMPILED_ONE_IN = 3
# A loop's case in LOOP_COMPILED_ONE_IN: an eager loop case takes a few tenths of a second, a
# compiled one seconds of compiling (Note [Compiled loops]), and a loop's whole-contract search
# (the selftest's, check_target's) draws them all and shrinks a compiled failure compiled, each
# candidate compiled afresh. (One in six made a loop mutant's 12-case search 155 s, from 40.)
LOOP_COMPILED_ONE_IN = 10
# Of the compiled cases, where the inductor is asked for, one in INDUCTOR_ONE_IN is lowered by it
# (gcc on the CPU: seconds to a minute of compiling a case, against about 1-4 s for aot_eager;
# Note [Compiled cases]).
INDUCTOR_ONE_IN = 4


def _for_kind(name: str, loop: bool) -> bool:
    setting = COMPILE_SETTINGS[name]
    if loop:  # the graph-break optimiser acts on torch DDP, which a loop's model is not
        return setting.optimize_ddp is not True
    return not setting.whole_step  # a DDP case has no step of the target's


@st.composite
def compile_settings(
    draw, *, inductor: bool = True, loop: bool = False, every_setting: bool = True
) -> str:
    """A name of ``COMPILE_SETTINGS``: the inductor's in one draw of ``INDUCTOR_ONE_IN`` (never
    without ``inductor``), else aot_eager's; the graph-break optimiser or compiled autograd drawn
    alike, and for a ``loop`` its model compiled plainly, or with ``every_setting`` plainly in one
    draw of two, else compiled autograd or the whole step alike (no graph-break optimiser: Note
    [Compiled loops]). Shrinks toward plain ``aot_eager``."""
    lowered = draw(st.integers(0, INDUCTOR_ONE_IN - 1)) == INDUCTOR_ONE_IN - 1
    backend = "inductor" if lowered and inductor else ""
    names = [
        n
        for n in COMPILE_SETTINGS
        if (COMPILE_SETTINGS[n].backend == "inductor") == bool(backend) and _for_kind(n, loop)
    ]
    if not loop:
        return draw(st.sampled_from(names))
    # A loop's model compiled plainly in half its compiled cases at most: compiled autograd and
    # the whole step compiled cost it three to four times as much (Note [Compiled loops]).
    costly = every_setting and draw(st.booleans())
    return draw(st.sampled_from(names[1:])) if costly else names[0]


@st.composite
def compiled_cases(draw, *, inductor: bool = False, **kw):
    """``cases(**kw)``, compiled in one case of ``COMPILED_ONE_IN`` with a drawn setting
    (``compile_settings``; the inductor's only where ``inductor`` is given, as paracheck's own
    second tier gives it, and in float64 cases only: its fused kernels round otherwise than eager
    ones below float64, which no bound here derives; drawn in every check, gcc's minute a case
    took most of a check's time), in cases of float32 parameters
    or wider without autocast only: AOTAutograd traces autocast's casts into its graph, where a
    tied weight cast once per forward in eager is cast at each use and its gradients summed in
    float32 (1.9e-6 from eager's 2.7e-2 in a bfloat16 case, where 5.7e-8 is eager's own bound).
    Drawn last, so that the draws before are those of the plain cases."""
    return _compiled_sometimes(draw, draw(cases(**kw)), inductor, COMPILED_ONE_IN, None)


@st.composite
def compiled_loop_cases(draw, *, inductor: bool = False, every_setting: bool = False, **kw):
    """``loop_cases(**kw)``, compiled in one case of ``LOOP_COMPILED_ONE_IN`` (Note [Compiled
    loops]): the model the step is handed compiled, and where ``every_setting`` is given (as
    paracheck's own tests give it) in half the compiled cases the whole step, or the model with
    its backward under compiled autograd (``compile_settings(loop=True)``), on the terms of
    ``compiled_cases``: the inductor only where asked and at float64, and no case with autocast
    (a loop declaring its own) or parameters below float32 compiled."""
    return _compiled_sometimes(
        draw, draw(loop_cases(**kw)), inductor, LOOP_COMPILED_ONE_IN, every_setting
    )


def _compiled_sometimes(draw, case, inductor: bool, one_in: int, every_setting: bool | None):
    """``case`` compiled in one draw of ``one_in``; ``every_setting`` None for a DDP case, else
    a loop's (``compile_settings``)."""
    if case.autocast is not None or case.dtype not in ("float32", "float64"):
        return case
    if draw(st.integers(0, one_in - 1)) == one_in - 1:
        lowered = inductor and case.dtype == "float64"
        loop = every_setting is not None
        setting = compile_settings(inductor=lowered, loop=loop, every_setting=bool(every_setting))
        case = replace(case, compiled=draw(setting))
    return case
