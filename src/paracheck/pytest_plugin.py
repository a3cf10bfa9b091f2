"""paracheck's pytest plugin (entry point ``pytest11``). Cheap to import: no torch at collection.

Options:
    --paracheck-backend gloo|nccl      backend of the shared runner (default gloo)
    --paracheck-world-sizes 1,2,4      world sizes the properties draw from (default: the plan's,
                                       paracheck.check.settings.DEFAULT_WORLD_SIZES)
    --paracheck-profile ci|dev|nightly Hypothesis settings for paracheck properties (ci: derandomised;
                                       the default, unless --hypothesis-profile names a profile)
    --paracheck-max-examples N         generated cases per search (default: the profile's)
    --paracheck-timeout SECONDS        per-case hang timeout (default 20)
    --paracheck-rank-memory GB         cap on each rank's resident memory (default: a share of RAM)
    --paracheck-stub-cuda-timing       CUDA timing/NVTX calls are no-ops in the ranks (CPU-only machines)
    --paracheck-properties NAME,...    the properties ``paracheck_check`` checks (as ``paracheck check
                                       --properties``)
    --paracheck-contract full|cs336    the case features drawn (as ``paracheck check --contract``)
    --paracheck-precision NAME         fp64 (default), fp32, bf16, fp16 or mixed (as --precision)
    --paracheck-loss token-mean|batch-mean  a loop target's loss semantics (as --loss)
    --paracheck-clip-norm NORM         the global norm a loop target clips to (as --clip-norm)
    --paracheck-features=-name,+name   features never drawn / drawn again (as ``--features``; give
                                       it with ``=``: pytest reads a value starting with - as an option)
    --paracheck-model pkg.mod:build    check on your own model (as ``--model``; with
    --paracheck-batch pkg.mod:batch    ``--paracheck-batch``, and ``--paracheck-loss-fn`` where
    --paracheck-loss-fn pkg.mod:loss   the mean squared error is not the loss); checked at startup:
                                       a model that cannot be checked is a usage error
    --paracheck-database PATH          failing cases saved and replayed first (default
                                       .paracheck/examples under the rootdir)
    --paracheck-no-database            save and replay nothing
    --paracheck-incomplete incomplete|pass  a verdict table (``table=True``) with rows its budget
                                       did not reach fails the test (as ``paracheck check``
                                       exits 3), or passes on the rows reached
    --paracheck-allow-large-world      gloo world sizes above what the machine runs (refused otherwise)

Hypothesis's own ``--hypothesis-profile`` (its max_examples and derandomize, where no
``--paracheck-profile`` is given) and ``--hypothesis-seed`` (the cases' sequence) apply to
``paracheck_check`` too.

Markers: ``world_size(n)`` (skipped when n exceeds what the backend can run), ``gpu`` (skipped
without CUDA). Every skip of either kind is counted and reported at the end of the session:
silent skips hide bugs.

Fixtures: ``paracheck_world`` (one persistent ``World`` per session and xdist worker; on GPU
machines each xdist worker gets disjoint devices), ``paracheck_world_sizes``,
``paracheck_max_examples``, ``paracheck_check`` (checks a target and fails the test with the full
report).
"""

from __future__ import annotations

import contextlib
import os

import pytest

from paracheck.check.settings import PROFILES, from_pytest

_SKIPS: dict[str, int] = {"gpu": 0, "world_size": 0}


class _Verdict(pytest.fail.Exception):
    """A failed ``paracheck_check``: its report is the failure's text (pytest's ``Failed``)."""


def _fail(text: str) -> None:
    raise _Verdict(text, pytrace=False)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """The short test summary gives a failed check's first line only: on CI (``CI`` set) and under
    ``-vv`` pytest repeats a failure's whole message there, and the shrunk case would print twice."""
    report = yield
    crash = getattr(report.longrepr, "reprcrash", None)
    if call.excinfo is not None and isinstance(call.excinfo.value, _Verdict) and crash:
        crash.message = crash.message.split("\n", 1)[0]
    return report


def pytest_addoption(parser):
    # The options of paracheck check, declared once (Note [One declaration per option]).
    from paracheck.check.settings import add_pytest_options

    add_pytest_options(parser.getgroup("paracheck"))


def pytest_configure(config):
    config.addinivalue_line("markers", "world_size(n): the test needs n ranks")
    config.addinivalue_line("markers", "gpu: the test needs CUDA devices")
    # The options a check is planned from, checked here, at once, rather than in every test that
    # checks a target (Note [One plan per check]); the features only when given, as their table
    # imports torch.
    from paracheck.check.plan import settled

    with _usage_errors():
        given = settled(from_pytest(config))
        if any(v is not None for v in (given.model, given.batch, given.loss_fn)):
            # A user's model is checked here, in the driver and in each xdist worker (torch is
            # imported only when one is named): a bad one ends the session at once, a usage error
            # naming the option, before any World starts (Note [A user's model]).
            from paracheck.check.user_model import user_model_of

            user_model_of(given.model, given.batch, given.loss_fn)
    names = _properties(config)
    if names is not None:
        from paracheck.check.kinds import KINDS

        every = {p for row in KINDS.values() for p in row.properties}
        unknown = sorted({n.removeprefix("+") for n in names} - every)
        if unknown or not names:
            raise pytest.UsageError(
                f"--paracheck-properties={config.getoption('--paracheck-properties')}: "
                f"{'unknown ' + str(unknown) if unknown else 'names no property'}; choose from "
                f"{sorted(every)}"
            )


@contextlib.contextmanager
def _usage_errors():
    """An ``InvalidArgument`` of the plan as a pytest usage error naming the ``--paracheck-*``
    option."""
    from paracheck.errors import InvalidArgument

    try:
        yield
    except InvalidArgument as exc:
        raise pytest.UsageError(exc.text("--paracheck-")) from None


def _properties(config) -> list[str] | None:
    text = config.getoption("--paracheck-properties")
    if text is None:
        return None
    return [p.strip() for p in text.split(",") if p.strip()]


def _search_settings(config) -> tuple[int, object]:
    """(max_examples, seed) of ``paracheck_check``: ``--paracheck-profile`` when given, else the
    Hypothesis profile named by ``--hypothesis-profile``, else ci; ``--hypothesis-seed`` when
    given fixes the sequence (``check_target``'s ``seed``: 0 is the derandomised one)."""
    profile = config.getoption("--paracheck-profile")
    hypothesis_profile = config.getoption("--hypothesis-profile", None)
    if profile is None and hypothesis_profile:
        from hypothesis import settings

        chosen = settings.get_profile(hypothesis_profile)
        max_examples, seed = chosen.max_examples, 0 if chosen.derandomize else None
    else:
        name = profile or "ci"
        max_examples = PROFILES[name]["max_examples"]
        seed = 0 if PROFILES[name]["derandomize"] else None
    if config.getoption("--paracheck-max-examples", None) is not None:
        max_examples = config.getoption("--paracheck-max-examples")
    given = config.getoption("--hypothesis-seed", None)
    if given is not None:
        try:
            seed = int(given)
        except ValueError:
            seed = given  # Hypothesis takes any hashable seed
    return max_examples, seed


def _attached_pool(config) -> dict | None:
    """The size and backend of the agents at ``--paracheck-attach`` (None without it)."""
    attach = config.getoption("--paracheck-attach")
    if attach is None:
        return None
    pool = getattr(config, "_paracheck_pool", None)
    if pool is None:
        from paracheck.world.attached import pool_of

        try:
            pool = pool_of(attach)
        except (ValueError, RuntimeError) as exc:
            raise pytest.UsageError(str(exc).replace("attach=", "--paracheck-attach=", 1)) from None
        backend = config.getoption("--paracheck-backend")
        if backend != "gloo" and backend != pool["backend"]:
            raise pytest.UsageError(
                f"--paracheck-backend={backend} but the agents at --paracheck-attach={attach} run "
                f"{pool['backend']}"
            )
        config._paracheck_pool = pool
    return pool


def _world_sizes(config) -> tuple[int, ...]:
    """The world sizes of the session's checks, as the plan gives them (Note [One plan per
    check]): ``--paracheck-world-sizes``, else every agent attached, else its default."""
    from paracheck.check.plan import world_sizes

    with _usage_errors():
        return world_sizes(from_pytest(config), pool=_attached_pool(config))


def _cuda_count() -> int:
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _worker_devices(config) -> list[str]:
    """This xdist worker's share of the GPUs: worker k of n takes devices k, k+n, k+2n, ..."""
    total = _cuda_count()
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    n_workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    k = int(worker[2:]) if worker.startswith("gw") and worker[2:].isdigit() else 0
    return [f"cuda:{i}" for i in range(k, total, max(1, n_workers))]


def pytest_collection_modifyitems(config, items):
    # Decide GPU skips here, once; world_size skips need the backend, also known now.
    backend = config.getoption("--paracheck-backend")
    need_devices = any(item.get_closest_marker("gpu") for item in items) or backend == "nccl"
    available = len(_worker_devices(config)) if need_devices else 0
    pool = _attached_pool(config)
    if pool is not None:  # the agents' devices, not this machine's
        backend = pool["backend"]
        available = pool["size"] if backend == "nccl" else 0
    elif backend == "nccl" and _cuda_count() == 0:
        # Asked for by name: skipping every test would pass a GPU job that checked nothing.
        raise pytest.UsageError(
            "--paracheck-backend=nccl: no CUDA device is visible (torch.cuda.device_count() is 0); "
            "use gloo on a machine without GPUs"
        )
    for item in items:
        if item.get_closest_marker("gpu") and available == 0:
            item.add_marker(pytest.mark.skip(reason="paracheck: needs CUDA devices, none present"))
            item.user_properties.append(("paracheck_skip", "gpu"))
            continue  # counted once, as a GPU skip
        m = item.get_closest_marker("world_size")
        if m is not None and m.args:
            n = int(m.args[0])
            limit = (
                available
                if backend == "nccl" or item.get_closest_marker("gpu")
                else max(_world_sizes(config))
            )
            if n > limit:
                item.add_marker(
                    pytest.mark.skip(reason=f"paracheck: world size {n} > {limit} available")
                )
                item.user_properties.append(("paracheck_skip", "world_size"))


def pytest_runtest_logreport(report):
    if report.skipped and report.when in ("setup", "call"):
        marked = False
        for key, value in getattr(report, "user_properties", []):
            if key == "paracheck_skip":
                _SKIPS[value] += 1
                marked = True
        # The shared World's own skip (a worker given fewer GPUs than the largest world size).
        longrepr = report.longrepr
        reason = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else ""
        if not marked and "paracheck: world size" in str(reason):
            _SKIPS["world_size"] += 1


def pytest_terminal_summary(terminalreporter):
    if _SKIPS["gpu"] or _SKIPS["world_size"]:
        terminalreporter.write_sep("-", "paracheck")
        terminalreporter.write_line(
            f"paracheck: {_SKIPS['gpu']} GPU test(s) skipped for lack of CUDA devices, "
            f"{_SKIPS['world_size']} skipped for lack of ranks/devices: those cases were NOT checked."
        )


@pytest.fixture(scope="session")
def paracheck_world_sizes(pytestconfig) -> tuple[int, ...]:
    return _world_sizes(pytestconfig)


@pytest.fixture(scope="session")
def paracheck_world(request, pytestconfig, paracheck_world_sizes):
    """One persistent World per session (and per xdist worker), sized for the largest world size."""
    from paracheck.world import World

    backend = pytestconfig.getoption("--paracheck-backend")
    timeout = pytestconfig.getoption("--paracheck-timeout")
    size = max(paracheck_world_sizes)
    attach = pytestconfig.getoption("--paracheck-attach")
    from paracheck.cli._common import UsageError
    from paracheck.cli.check import refuse_lockstep

    try:
        refuse_lockstep(attach, "--paracheck-attach")
    except UsageError as exc:
        pytest.fail(f"paracheck: {exc}", pytrace=False)
    if attach is not None:
        from paracheck.world.attached import AttachedWorld

        if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1:
            pytest.fail(
                f"paracheck: --paracheck-attach={attach} takes one driver per pool of agents, and "
                "pytest-xdist started several: run without -n",
                pytrace=False,
            )
        world = AttachedWorld(attach, timeout=timeout)
        yield world
        if request.session.exitstatus == pytest.ExitCode.INTERRUPTED:
            world.kill()
        else:
            world.close()
        return
    devices = None
    if backend == "nccl":
        devices = _worker_devices(pytestconfig)
        if size > len(devices):
            pytest.skip(
                f"paracheck: world size {size} needs {size} GPUs, this worker has {len(devices)}"
            )
    world = World(
        size,
        backend=backend,
        timeout=timeout,
        devices=devices,
        rank_memory=pytestconfig.getoption("--paracheck-rank-memory"),
    )
    yield world
    if request.session.exitstatus == pytest.ExitCode.INTERRUPTED:
        world.kill()  # Ctrl-C: the ranks may be inside a job, which close() would wait for
    else:
        world.close()


@pytest.fixture(scope="session")
def paracheck_max_examples(pytestconfig) -> int:
    return _search_settings(pytestconfig)[0]


def _database(config):
    if config.getoption("--paracheck-no-database"):
        return None
    path = config.getoption("--paracheck-database")
    return path if path is not None else str(config.rootpath / ".paracheck" / "examples")


@pytest.fixture
def paracheck_check(paracheck_world, paracheck_world_sizes, paracheck_max_examples, pytestconfig):
    """``paracheck_check("pkg.mod:Class", **kw)`` checks a target and fails the test with the report.

    ``properties`` (names, or "a,b"), ``contract``, ``features``, ``precision``, a loop's
    ``loss`` and ``clip_norm``, and a user's ``model``, ``batch`` and ``loss_fn`` (import paths:
    Note [A user's model] in ``paracheck.workloads.user``) default to the ``--paracheck-*``
    options (``features`` applies after the option's); other keywords go to ``check_target``
    (``database=None`` saves nothing)."""
    from paracheck.check.kinds import KINDS
    from paracheck.check.property import check_target
    from paracheck.check.targets import resolve_target

    seed = _search_settings(pytestconfig)[1]

    # The stub is for machines without CUDA; on nccl it would hide real synchronisation.
    stub_default = (
        pytestconfig.getoption("--paracheck-stub-cuda-timing")
        and pytestconfig.getoption("--paracheck-backend") != "nccl"
    )

    def check(
        target,
        *,
        kind=None,
        world_sizes=None,
        max_examples=None,
        finish=None,
        batch_start=None,
        stub_cuda_timing=None,
        properties=None,
        contract=None,
        features=None,
        precision=None,
        loss=None,
        clip_norm=None,
        gather=None,
        model=None,
        batch=None,
        loss_fn=None,
        **kwargs,
    ):
        stub = stub_default if stub_cuda_timing is None else stub_cuda_timing
        if isinstance(target, str):
            hooks = dict(
                finish=finish, batch_start=batch_start, stub_cuda_timing=stub, gather=gather
            )
            t = resolve_target(target, kind, loss=loss, clip_norm=clip_norm, **hooks)
            # The options apply to the targets whose kind takes them (a loop's: Kind.options), as
            # --paracheck-properties to the kinds that have the property; keywords given here
            # win over them.
            opt_loss = pytestconfig.getoption("--paracheck-loss")
            opt_clip = pytestconfig.getoption("--paracheck-clip-norm")
            takes = KINDS[t.kind].options
            if (opt_loss and "loss" in takes) or (opt_clip is not None and "clip_norm" in takes):
                t = resolve_target(
                    target,
                    kind,
                    loss=loss or opt_loss,
                    clip_norm=clip_norm if clip_norm is not None else opt_clip,
                    **hooks,
                )
        else:
            t = target
        t = _with_properties(t, properties, pytestconfig)
        spec = [
            *_items(pytestconfig.getoption("--paracheck-features")),
            *_items(features),
        ]
        # One search over the whole contract, every failing property labelled with the features
        # it needs (the plugin's own settings: Note [One set of defaults]; keywords override
        # any setting). The World is started: no rank limit to apply again (``backend``).
        given = from_pytest(pytestconfig)
        t, precision = _on_user_model(t, given, (model, batch, loss_fn), precision)
        settings = given.replace(
            world_sizes=tuple(world_sizes or paracheck_world_sizes),
            max_examples=max_examples or paracheck_max_examples,
            seed=seed,
            contract=contract or given.contract,
            features=spec or None,
            precision=precision or given.precision,
            database=_database(pytestconfig),
            backend=None,
        )
        report = check_target(t, paracheck_world, settings, **kwargs)
        report.incomplete_passes = kwargs.get("incomplete", settings.incomplete) == "pass"
        if not report.passed:
            # Every failing property, labelled and shrunk, with its replay command (and the CUDA
            # diagnosis of paracheck.check.diagnose where a rank raised).
            _fail(report.text(pytestconfig.getoption("--paracheck-backend")))
        if report.verdict == "INCOMPLETE":
            # A verdict table (table=True) whose budget ran out: its rows not reached are not a
            # pass, as the command's exit 3 is not (--paracheck-incomplete pass accepts them).
            _fail(
                report.text(pytestconfig.getoption("--paracheck-backend"))
                + "\n(--paracheck-incomplete pass accepts the rows reached)"
            )
        return report

    return check


def _on_user_model(target, given, names: tuple, precision):
    """``target`` checked on the user's model of the keywords ``names`` (model, batch, loss_fn),
    else of ``--paracheck-model``, ``--paracheck-batch`` and ``--paracheck-loss-fn``, and the
    precision: fp32 where the model cannot run in float64 and none is given (Note [A float32
    oracle for a user's model] in ``paracheck.workloads.user``)."""
    from paracheck.check.user_model import info, user_model_of, with_user_model
    from paracheck.errors import InvalidArgument

    keywords = any(n is not None for n in names)
    refused = None
    try:
        user = user_model_of(*(names if keywords else (given.model, given.batch, given.loss_fn)))
        target = with_user_model(target, user)
    except InvalidArgument as exc:
        refused = exc.text(None if keywords else "--paracheck-")
    if refused is not None:
        # The test fails on the rule broken, naming the keyword or the option, with no traceback
        # (the command line's exit 2).
        pytest.fail(f"paracheck: {refused}", pytrace=False)
    if user is None or info(user).float64:
        return target, precision
    chosen = precision or given.precision
    if chosen not in (None, "fp32"):
        named = "model" if keywords else "--paracheck-model"
        pytest.fail(
            f"paracheck: {named}={user.build!r}: does not run in float64 ({info(user).why_not}); "
            f"check it at precision fp32, not {chosen}",
            pytrace=False,
        )
    return target, "fp32"


def _items(spec) -> list[str]:
    if spec is None:
        return []
    return [x for x in (spec.split(",") if isinstance(spec, str) else list(spec)) if x.strip()]


def _with_properties(target, properties, config):
    """``target`` checking ``properties`` (every name must be one of its kind's), or else the
    ``--paracheck-properties`` of its kind (a warning where they name none of them)."""
    import dataclasses
    import warnings

    from paracheck.check.kinds import resolve_properties, select_properties

    if properties is not None:
        names = _items(properties)
        chosen = resolve_properties(
            target.kind, names, takes_bucket=target.takes_bucket, base=target.properties
        )
        return dataclasses.replace(target, properties=chosen)
    names = _properties(config)
    if names is None:
        return target
    (selected,), notes = select_properties([target], names, refuse_none=False)
    for note in notes:
        warnings.warn(f"paracheck: {note}", stacklevel=3)
    return selected
