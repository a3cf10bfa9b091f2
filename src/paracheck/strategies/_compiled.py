"""The DDP kind's cases with compiled ones among them (Note [Compiled cases] in
``paracheck.cases._compile``): ``cases()`` as drawn, and, drawn last, whether and how the wrapper
is compiled."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import strategies as st

from paracheck.cases import COMPILE_SETTINGS
from paracheck.strategies._core import cases

__all__ = ["compile_settings", "compiled_cases"]

# One drawn case in COMPILED_ONE_IN is compiled: the compile row keeps only those (a filter that
# rejects the rest before they run), and every other row removes the feature, so the others cost
# a draw and nothing more. (One in six instead saved 5 s of the first tier's 6 min 29 s and
# changed the derandomised sequences enough that a mutant killed at world sizes 1 and 2 in 40
# cases survived them.)
COMPILED_ONE_IN = 3
# Of the compiled cases, where the inductor is asked for, one in INDUCTOR_ONE_IN is lowered by it
# (gcc on the CPU: seconds to a minute of compiling a case, against about 1-4 s for aot_eager;
# Note [Compiled cases]).
INDUCTOR_ONE_IN = 4


@st.composite
def compile_settings(draw, *, inductor: bool = True) -> str:
    """A name of ``COMPILE_SETTINGS``: the inductor's in one draw of ``INDUCTOR_ONE_IN`` (never
    without ``inductor``), else aot_eager's; the graph-break optimiser or compiled autograd drawn
    alike. Shrinks toward plain ``aot_eager``."""
    lowered = draw(st.integers(0, INDUCTOR_ONE_IN - 1)) == INDUCTOR_ONE_IN - 1
    backend = "inductor" if lowered and inductor else ""
    names = [
        n for n in COMPILE_SETTINGS if (COMPILE_SETTINGS[n].backend == "inductor") == bool(backend)
    ]
    return draw(st.sampled_from(names))


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
    case = draw(cases(**kw))
    if case.autocast is not None or case.dtype not in ("float32", "float64"):
        return case
    if draw(st.integers(0, COMPILED_ONE_IN - 1)) == COMPILED_ONE_IN - 1:
        setting = draw(compile_settings(inductor=inductor and case.dtype == "float64"))
        case = replace(case, compiled=setting)
    return case
