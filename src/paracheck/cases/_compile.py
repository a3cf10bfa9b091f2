"""How a compiled case is compiled (``Case.compiled``): the ``torch.compile`` settings a case names,
one row each. Pure values; the rank program that applies them is ``paracheck.check.ranks._compiled``.

Note [Compiled cases]
    A compiled case trains the same model, batches and protocol as its eager twin, with the DDP
    wrapper called through ``torch.compile(wrapper, backend=...)`` (what users write:
    ``model = torch.compile(DDP(model))``; gradients were not synchronised where only the inner
    module was compiled) and, with compiled autograd, every backward of the step traced and
    compiled too. Three choices are drawn, as one named setting (``COMPILE_SETTINGS``):

    * the backend: ``aot_eager`` (Dynamo's capture and AOTAutograd's joint graph run by eager
      kernels: where DDP's semantics change under compile, graph breaks, hooks and the
      forward/backward split, at about 1-4 s a case on a loaded 2-core machine) or ``inductor``
      (the same graphs lowered to C++ on the CPU, Triton on a GPU: seconds to a minute a case on
      the CPU, gcc compiling every new kernel; its on-disk caches make a shape seen before cheap);
    * DDP's graph-break optimiser (``torch._dynamo.config.optimize_ddp``): on, Dynamo splits the
      graph at torch DDP's bucket boundaries so that its reducer's hooks fire between the pieces;
      off, one graph, and every bucket is reduced after the whole backward. It acts on torch
      ``DistributedDataParallel`` only (a wrapper of another class is compiled alike either way);
    * compiled autograd (``torch._dynamo.compiled_autograd``): the backward, gradient hooks
      included, traced at run time and compiled. torch DDP refuses it beside its C++ reducer
      ("Compiled autograd is not compatible with C++ DDP Reducer"), so the setting also names
      ``optimize_ddp="python_reducer"``, torch's documented pairing.

    Compile time is paid once per graph and shape: Dynamo's caches are reset before each compiled
    case (``torch._dynamo.reset()``), so that no case depends on what a rank compiled before (a
    recompile limit reached after eight shapes falls back to eager silently) and every case
    compiles its own graphs, at a cost the rank records (``RankRecord.compiled``). Cases are not
    fixed to a few shapes: Dynamo marks a dimension dynamic on its second shape, but the reset
    makes each case its first. A check draws the ``aot_eager`` settings only: the inductor's
    cost gcc up to a minute a case on the CPU, most of a check's time where they were drawn in
    one compiled case of four. They are drawn where asked (``compiled_cases(inductor=True)``, as
    paracheck's own second tier asks, in float64 cases only: below it, fused kernels round
    otherwise than the eager ones the derived bounds describe) and run from a case file
    (``--case`` with ``"compiled": "inductor"``). No case with autocast or parameters below
    float32 is compiled: the traced casts round otherwise than eager's cached ones
    (``compiled_cases``), and the bounds derived for eager do not describe them.

    A row of the verdict table says how much of its time went to compiling: "[10 cases, 14.2 s,
    9.1 s of it compiling]" (``compiling_seconds`` in its JSON; ``RowVerdict.compiling``), the sum
    over the compiled cases the row ran of rank 0's compile seconds (``RankRecord.compiled``,
    which a case's result keeps). Rank 0's, not the slowest rank's: every rank compiles the same
    graphs at the same time, so the ranks' compiling overlaps and one rank's is the wall time it
    took. A case an earlier row ran (cached) cost the row nothing and is not counted in it.

Note [Compiled loops]
    A loop target is the whole step (``train_step(model, optimizer, micro_batches)``), so "the
    model under torch.compile" has two readings, and a compiled loop case may take either
    (``compiled_loop_cases``; none with DDP's graph-break optimiser: a loop's model is no torch
    DDP):

    * the model the step is handed, compiled (``aot_eager``; ``+compiled-autograd``: with every
      backward of the step compiled too): what users write before their loop
      (``model.compile()``, ``model = torch.compile(model)``). It is compiled in place
      (``nn.Module.compile``): the step is handed the module it is handed eagerly, the same class,
      parameters and ``state_dict()`` keys, its calls compiled. So a step that compiles the model
      itself (``torch.compile(model)`` in its first call) is checked as written: on torch 2.13,
      ``torch.compile`` of a module ``torch.compile`` returned (an ``OptimizedModule``) returns a
      function, and such a step, handed one, raised on ``model.parameters()``;
    * the whole step (``+whole-step``): the step called through ``torch.compile``, Dynamo tracing
      the model's forward inside it and breaking the graph where the step leaves what it can
      trace (``backward()``, a collective it cannot capture, ``.item()``), as a step decorated
      with ``@torch.compile`` runs. A DDP case has no step of the target's: a case file naming a
      whole-step setting for one is skipped, saying so.

    A step that compiles itself (or its model) is checked so in its eager cases already, and in
    its compiled ones compiled within paracheck's compile, which torch accepts. Its graphs are
    then its own backend's, not the counting backend's: ``RankRecord.compiled``'s ``graphs`` may
    be 0. A compiled loop case is judged by the loop kind's properties, as an eager one: a loop
    issues its collectives itself, outside any window the ledger of compile-ledger reads (Note
    [A sync compiled away]), and ``equivalence`` judges what it computed.

    A check draws the model compiled plainly with aot_eager, one loop case in ten. On a loaded
    2-core machine a loop's model compiled plainly took 1.4-5.7 s of compiling a case, with
    compiled autograd or as a whole step 6-17 s (every micro-batch's backward, or the step's
    pieces between graph breaks, compiled: 3 and 8 graphs), and a loop's compile row with
    them drawn in half its cases took 80 of the command's 90 s (the rows after it were not
    reached). So compiled autograd and the whole step are drawn where asked
    (``compiled_loop_cases(every_setting=True)``: in half the compiled cases), the inductor where
    asked too, any of them runs from a case file (``"compiled": "aot_eager+whole-step"``), and
    paracheck's own tests run each on a pinned case (tests/property/test_compiled.py). One case in ten, not one in three as a DDP's: an
    eager loop case takes a few tenths of a second, and the selftest's and ``check_target``'s
    whole-contract searches draw every case, and shrink a compiled failure compiled.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["COMPILE_SETTINGS", "CompileSetting", "check_compiled"]


@dataclass(frozen=True)
class CompileSetting:
    """One way a case is compiled (Note [Compiled cases])."""

    name: str
    backend: str  # torch.compile's backend= ("aot_eager", "inductor")
    optimize_ddp: bool | str  # torch._dynamo.config.optimize_ddp
    compiled_autograd: bool  # the backward under torch._dynamo.compiled_autograd too
    # A loop's whole step called through torch.compile too (Note [Compiled loops]); the loop
    # kind's only: a DDP case has no step of the target's to compile.
    whole_step: bool = False


def _setting(
    backend: str, optimize_ddp: bool, compiled_autograd: bool, whole_step: bool = False
) -> CompileSetting:
    name = backend + ("+optimize-ddp" if optimize_ddp else "")
    name += "+compiled-autograd" if compiled_autograd else ""
    name += "+whole-step" if whole_step else ""
    # torch DDP's C++ reducer refuses compiled autograd; its Python reducer is the pairing torch
    # names for it (Note [Compiled cases]).
    mode: bool | str = "python_reducer" if compiled_autograd else optimize_ddp
    return CompileSetting(name, backend, mode, compiled_autograd, whole_step)


# Every setting a case may name, the aot_eager ones first (the ones drawn most: Note [Compiled
# cases]); compiled autograd replaces the graph-break optimiser (torch pairs it with the Python
# reducer), so there is no setting with both; a loop's whole step is compiled plainly.
COMPILE_SETTINGS: dict[str, CompileSetting] = {
    s.name: s
    for s in (
        _setting(backend, optimize_ddp, autograd, whole_step)
        for backend in ("aot_eager", "inductor")
        for optimize_ddp, autograd, whole_step in (
            (False, False, False),
            (True, False, False),
            (False, True, False),
            (False, False, True),
        )
    )
}


def check_compiled(value) -> None:
    """ValueError naming ``compiled=value`` unless it is None or a name of ``COMPILE_SETTINGS``."""
    if value is not None and value not in COMPILE_SETTINGS:
        raise ValueError(f"compiled={value!r} must be None or one of {list(COMPILE_SETTINGS)}")
