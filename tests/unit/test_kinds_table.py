"""The table of kinds is complete: every ``"module:function"`` it names imports and is callable,
every property a row names has a check, and every reading a row declares is one the target
reader understands (reference: ``paracheck.check.kinds``)."""

import importlib

import pytest

from paracheck.check.kinds import KINDS, PROPERTY_CHECKS, STUB_RANK_FN, Kind
from paracheck.check.targets import BUILTIN_TARGETS


def _resolve(reference: str):
    module, sep, name = reference.partition(":")
    assert sep and module and name, f"{reference!r} is not 'module:function'"
    obj = importlib.import_module(module)
    for part in name.split("."):
        obj = getattr(obj, part)
    assert callable(obj), f"{reference!r} is a {type(obj).__name__}, not callable"
    return obj


@pytest.mark.parametrize("name", list(KINDS))
def test_every_name_in_a_row_resolves(name):
    """A row's rank program, strategy and first cases import; its properties are checked by
    something."""
    row = KINDS[name]
    assert isinstance(row, Kind) and row.name == name
    _resolve(row.rank_fn)
    _resolve(row.strategy)
    if row.first_cases is not None:
        _resolve(row.first_cases)
    unknown = [p for p in row.properties if p != "equivalence" and p not in PROPERTY_CHECKS]
    assert not unknown, f"{name}: properties without a check: {unknown}"
    assert set(row.bucket_only) <= set(row.properties)
    assert row.prepare_case is None or callable(row.prepare_case)


@pytest.mark.parametrize("name", list(KINDS))
def test_every_reading_of_a_row_is_understood(name):
    """The declared readings are of the forms ``paracheck.check.interfaces.declares`` reads; a
    row that wraps an optimizer class passes it second; owned parts are known words."""
    row = KINDS[name]
    for reading in (row.step_gradients, row.masters):
        assert reading is None or reading == "param.grad" or reading.endswith(("()", "="))
    assert row.owns and row.owns <= {"gradients", "optimizer", "parameters", "step"}
    assert row.state_layout in (None, "per-parameter", "flat")
    if row.constructor is not None:
        assert row.constructor.first and row.constructor.passes
        assert not row.constructor.wraps_optimizer or row.constructor.first[1] == "optimizer_cls"
    else:
        assert "step" in row.owns  # only a training step is called rather than constructed


def test_property_checks_and_the_stub_resolve():
    """Each property check that names its module imports it; the CUDA stub's entry imports."""
    for prop, check in PROPERTY_CHECKS.items():
        assert callable(check), prop
        reference = getattr(check, "reference", None)
        if reference is not None:
            _resolve(reference)
    _resolve(STUB_RANK_FN)


def test_every_builtin_has_a_kind():
    """Every built-in target is of a kind in the table, and its path names a module:Name."""
    for name, (path, kind) in BUILTIN_TARGETS.items():
        assert kind in KINDS, f"{name}: kind {kind!r}"
        assert ":" in path, name


def test_a_broken_reference_is_refused():
    """The resolution this test relies on fails for a name that does not import."""
    with pytest.raises(ModuleNotFoundError):
        _resolve("paracheck.no_such_module:run")
    with pytest.raises(AttributeError):
        _resolve("paracheck.check.kinds:no_such_function")
