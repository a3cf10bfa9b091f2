"""Correct training steps that compile themselves, as users write them: checked as loops, they
are compiled in their eager cases and compiled within paracheck's compile in their compiled ones
(Note [Compiled loops])."""

import weakref

import torch

from paracheck.loop import train_step

# The whole step under torch.compile, as a step decorated with @torch.compile.
compiled_whole_step = torch.compile(train_step, backend="aot_eager")

_COMPILED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def model_compiling_step(model, optimizer, micro_batches):
    """``train_step`` with the model compiled at the step's first call with it."""
    if model not in _COMPILED:
        _COMPILED[model] = torch.compile(model, backend="aot_eager")
    train_step(_COMPILED[model], optimizer, micro_batches)
