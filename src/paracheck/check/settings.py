"""The options of a check, declared once: ``CheckSettings`` holds their values, ``OPTIONS`` says
how each is given on a command line. ``paracheck check`` and ``paracheck selftest`` build their
argparse options from ``OPTIONS`` (``add_arguments``), the pytest plugin its ``--paracheck-*``
options (``add_pytest_options``), and a failure's replay command the options that change its
verdict (``replay_options``). Importing this module imports neither torch nor Hypothesis (the
pytest plugin reads it at collection).

Note [One declaration per option]
    An option is one row of ``OPTIONS`` and one field of ``CheckSettings`` of the same name: its
    flag (``--max-examples``; ``--paracheck-max-examples`` in pytest), help, type, choices and the
    surfaces that offer it. Its default is the field's, unless a surface names its own
    (``Option.defaults``: the command line's verdict-table budget, the selftest's shorter hang
    timeout). A test checks that every row names a field and that the parsers built from the
    table offer exactly the rows of their surface.

Note [One set of defaults]
    The fields' defaults are ``check_target``'s, whichever way it is called: what a pytest user
    expects of a check inside a test, a verdict that does not depend on how loaded the machine
    is and leaves nothing behind: one search over the whole contract stopping at the first
    failing property (``table=False``, ``first_failure=True``, no labels), no time budget, the
    derandomised sequence (seed 0, the ci profile's 40 examples), no example database, the
    World's hang timeout. The command line's verdict table, labels, 90 s budget, 20 s timeout
    and database are its own (``Option.defaults`` and ``SURFACE_SETTINGS``), and so are the
    pytest fixture's labels. What none of them gives is worked out by ``paracheck.check.plan``
    (the world sizes: Note [One plan per check]).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field

from paracheck.check.kinds import properties_help

__all__ = [
    "CheckSettings",
    "DEFAULT_WORLD_SIZES",
    "OPTIONS",
    "Option",
    "PRECISIONS",
    "PROFILES",
    "SURFACE_SETTINGS",
    "add_arguments",
    "add_pytest_options",
    "from_namespace",
    "replay_options",
]

# Hypothesis settings per profile: ci is derandomised (same examples every run).
PROFILES = {
    "ci": dict(max_examples=40, derandomize=True),
    "dev": dict(max_examples=100, derandomize=False),
    "nightly": dict(max_examples=1000, derandomize=False),
}

CHECK, SELFTEST, PYTEST = "check", "selftest", "pytest"

# The world sizes a gloo check draws where none are given, the one default
# (``paracheck.check.plan.world_sizes`` applies it): every size up to four, which fits the 2-core
# machine's rank limit (Note [Gloo rank limit] in ``paracheck.check.limits``).
DEFAULT_WORLD_SIZES = (1, 2, 3, 4)
_DEFAULT_SIZES_TEXT = ",".join(map(str, DEFAULT_WORLD_SIZES))


@dataclass(frozen=True)
class CheckSettings:
    """Every option of a check, with the defaults of ``check_target`` (Note [One set of
    defaults]); ``paracheck.check.plan`` settles them for each target. ``check_target`` reads
    the search's (world sizes, examples, seed, precision, contract and features, the verdict
    table and its budget, timeouts, the example database); the command line and the pytest plugin
    read the others (how targets are resolved, which ranks run them, where the verdict goes).

    ``table``: the verdict table, one search per row (Note [The verdict table] in
    ``paracheck.check.property``); False: one search over the whole contract (the selftest's).
    ``budget``: seconds for the whole table (None: no limit). ``first_failure``: stop at the first
    failing row (without the table: the first failing property). ``labels`` and
    ``search_without``: without the table, label each failure with the features it needs, and
    search the cases without them."""

    # What the cases draw.
    # "1,2,4" as typed or integers; None: the plan's default (DEFAULT_WORLD_SIZES on gloo).
    world_sizes: tuple[int, ...] | str | None = None
    max_examples: int | None = None  # None: the profile's
    profile: str = "ci"
    seed: int | None = 0  # 0: Hypothesis's derandomised sequence; None: random
    random: bool = False
    dtype: str | None = None
    precision: str | None = None
    contract: str = "full"
    features: object = None  # "-name,+name" or a list of such items
    properties: str | None = None
    # How the search runs and reports.
    table: bool = False
    budget: float | None = None
    first_failure: bool = True
    # A search of the whole contract runs the kind's cases built for a bug first (``Kind.
    # first_cases``; the verdict table always does): the selftest, a stand-in for the table.
    first_cases: bool = False
    incomplete: str = "incomplete"  # a table with rows not reached: INCOMPLETE, or "pass"
    all: bool = False  # the main job: every built-in at the profile's examples
    labels: bool = False
    search_without: bool = True
    timeout: float | None = None  # None: the World's
    timeout_floor: float = 5.0
    hang_shrink_seconds: float = 10.0
    shrink_seconds: float | None = None
    database: str | None = None
    no_database: bool = False
    # Which ranks run the cases.
    backend: str | None = None
    attach: str | None = None
    attach_timeout: float = 30.0
    rank_memory: float | None = None
    allow_large_world: bool = False
    stub_cuda_timing: bool = False
    # How a target named on the command line is read.
    kind: str | None = None
    loss: str | None = None
    clip_norm: float | None = None
    reduce_dtype: str | None = None
    adapters: str | None = None
    finish: str | None = None
    gather: str | None = None
    batch_start: str | None = None
    # The user's own model (Note [A user's model] in paracheck.workloads.user): import paths.
    model: str | None = None
    batch: str | None = None
    loss_fn: str | None = None
    # What is checked and where the verdict goes.
    case: object = None  # the JSON a failure printed or a file (a Case once the CLI read it)
    json: str | None = None

    def replace(self, **changes) -> CheckSettings:
        return dataclasses.replace(self, **changes)

    @property
    def examples(self) -> int:
        """Generated cases per search: ``max_examples``, else the profile's."""
        if self.max_examples is not None:
            return self.max_examples
        return PROFILES[self.profile]["max_examples"]

    @property
    def search_seed(self) -> int | None:
        """The seed of every search: None with ``random``."""
        return None if self.random else self.seed

    @property
    def example_database(self) -> str | None:
        return None if self.no_database else self.database

    @property
    def replayed(self) -> str:
        """The options a failure's replay command carries (``replay_options``)."""
        return replay_options(self)


@dataclass(frozen=True)
class Option:
    """One command-line option of ``CheckSettings.<name>``: Note [One declaration per option]."""

    name: str
    help: str
    type: Callable | None = None  # None: a string; bool: a flag
    choices: tuple[str, ...] | None = None
    metavar: str | None = None
    surfaces: frozenset[str] = frozenset({CHECK, PYTEST})
    defaults: dict = field(default_factory=dict)  # surface -> its own default
    replay: bool = False  # carried by a failure's replay command where not the default

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    def default(self, surface: str = CHECK):
        if surface in self.defaults:
            return self.defaults[surface]
        return _FIELDS[self.name].default


PRECISIONS = ("fp64", "fp32", "bf16", "fp16", "mixed")
_BOTH = frozenset({CHECK, SELFTEST, PYTEST})

OPTIONS: tuple[Option, ...] = (
    Option(
        "world_sizes",
        f"comma-separated world sizes (default {_DEFAULT_SIZES_TEXT} on gloo, every device on "
        "nccl, every agent with --attach)",
        surfaces=_BOTH,
    ),
    Option(
        "allow_large_world",
        "run gloo world sizes above what this machine runs (4 ranks per core, 256 MiB of half its "
        "memory per rank: larger worlds are refused before any rank starts)",
        bool,
        surfaces=_BOTH,
    ),
    Option("max_examples", "generated cases per search (default: the profile's)", int, metavar="N"),
    Option(
        "seed",
        "the cases' sequence: 0 is Hypothesis's derandomised one (that of the selftest and the "
        "pytest plugin's ci profile), any other N hypothesis.seed(N) (default 0)",
        int,
        surfaces=frozenset({CHECK}),
    ),
    Option("random", "do not derandomise Hypothesis", bool, surfaces=frozenset({CHECK})),
    Option(
        "backend",
        "gloo: CPU ranks; nccl: one CUDA device per rank (default gloo; with --attach, the "
        "agents')",
        choices=("gloo", "nccl"),
        surfaces=_BOTH,
        defaults={SELFTEST: "gloo", PYTEST: "gloo"},
    ),
    Option(
        "attach",
        "run the cases on the agents that torchrun started (torchrun ... -m paracheck.agent) "
        "instead of on ranks of this machine: HOST:PORT is their MASTER_ADDR:MASTER_PORT; world "
        "sizes up to the agents' number are drawn, and closing stops the agents (default: none)",
        metavar="HOST:PORT",
    ),
    Option(
        "attach_timeout",
        "with --attach: how long to wait for the torchrun job and its agents before giving up "
        "(exit 2) (default %(default)s)",
        float,
        metavar="S",
        surfaces=frozenset({CHECK}),
    ),
    Option(
        "timeout",
        "longest a case may run before it counts as hung; cases are cut earlier, at 10x the "
        "slowest passing case of their world size, at least 5 s (default %(default)s)",
        float,
        surfaces=_BOTH,
        defaults={CHECK: 20.0, PYTEST: 20.0, SELFTEST: 10.0},
        replay=True,
    ),
    Option(
        "budget",
        "seconds for a target's whole verdict table; the rows not reached by then are listed "
        "(default %(default)s; 0: no limit)",
        float,
        metavar="SECONDS",
        surfaces=frozenset({CHECK}),
        defaults={CHECK: 90.0},
    ),
    Option(
        "rank_memory",
        "cap on each rank's resident memory during a case, in GB (2**30 bytes); a rank over it "
        "is stopped and its case reported as a resource failure (default: an equal share of the "
        "machine's memory among the ranks and this process, at least 1 GB)",
        float,
        metavar="GB",
        replay=True,
    ),
    Option(
        "kind",
        "interface of an import-path target (default: read from its constructor and methods); "
        "loop: a whole training step, train_step(model, optimizer, micro_batches)",
        choices=(),  # KINDS' names, given by add_arguments (this module does not import them)
        surfaces=frozenset({CHECK}),
    ),
    Option(
        "loss",
        "loop targets: the loss the step minimises, the global token mean or the mean of the "
        "micro-batches' means (default: the function's paracheck_loss attribute, else "
        "token-mean)",
        choices=("token-mean", "batch-mean"),
    ),
    Option(
        "clip_norm",
        "loop targets: the global gradient norm the step clips to with clip_grad_norm_ "
        "(default: the function's paracheck_clip_norm attribute, else no clipping)",
        float,
        metavar="NORM",
    ),
    Option(
        "reduce_dtype",
        "DDP targets: the dtype the target reduces its gradients in, checked on every all-reduce "
        "(default: the class's paracheck_reduce_dtype attribute, else not checked); cases whose "
        "parameters are wider are skipped",
        choices=("float64", "float32", "bfloat16"),
        surfaces=frozenset({CHECK}),
    ),
    Option(
        "adapters",
        "a CS336 adapters.py (file or module): check each design it implements (get_ddp, "
        "get_ddp_individual_parameters, get_ddp_bucketed, get_sharded_optimizer; default: none)",
        metavar="PATH_OR_MODULE",
        surfaces=frozenset({CHECK}),
    ),
    Option(
        "finish",
        "DDP after-backward hook: a method name, or module:function called as "
        "f(ddp_model, optimizer) (default finish_gradient_synchronization)",
        metavar="NAME",
        surfaces=frozenset({CHECK}),
    ),
    Option(
        "gather",
        "FSDP targets: how to read every parameter whole, a method name or module:function "
        "called as f(wrapper), returning a list in module.parameters() order or a dict by name "
        "(default: gather_full_params, full_parameters or gather_params; implies --kind fsdp)",
        metavar="NAME",
        surfaces=frozenset({CHECK}),
    ),
    Option(
        "batch_start",
        "DDP batch-start hook, named as --finish (default on_train_batch_start, if present)",
        metavar="NAME",
        surfaces=frozenset({CHECK}),
    ),
    Option(
        "model",
        "check the target on your own model: build(seed, dtype) -> torch.nn.Module, the same "
        "seed giving the same weights (needs --batch; default: paracheck's generated models)",
        metavar="pkg.mod:build",
    ),
    Option(
        "batch",
        "with --model: batch(seed, n, dtype) -> (inputs, targets), n rows each, split by rows "
        "over ranks and micro-batches (default: none; needed by --model)",
        metavar="pkg.mod:batch",
    ),
    Option(
        "loss_fn",
        "with --model: loss(output, targets) -> a scalar tensor, the mean over the rows it is "
        "given (default: the mean squared error)",
        metavar="pkg.mod:loss",
    ),
    Option(
        "stub_cuda_timing",
        "on CPU, make torch.cuda.synchronize/Event/Stream/nvtx no-ops in the ranks",
        bool,
    ),
    Option(
        "profile",
        "40 derandomised / 100 / 1000 examples per search (default %(default)s; in pytest, "
        "--hypothesis-profile where no --paracheck-profile is given)",
        choices=tuple(PROFILES),
        surfaces=_BOTH,
        defaults={PYTEST: None},
    ),
    Option(
        "dtype",
        "parameters' dtype: float64 (the default; float32 for loop targets) or float32; the "
        "same as --precision fp64/fp32",
        choices=("float64", "float32"),
        surfaces=frozenset({CHECK, SELFTEST}),
        defaults={SELFTEST: "float64"},
    ),
    Option(
        "precision",
        "the precision settings drawn: fp64 (the default; fp32 for loop targets), fp32, bf16 "
        "(bfloat16 autocast over float32 parameters, or bfloat16 parameters; a loop: bfloat16 "
        "parameters), fp16 (float16 autocast, with or without a GradScaler) or mixed (all of "
        "them); the oracle applies the same casts",
        choices=PRECISIONS,
    ),
    Option(
        "case",
        "replay exactly this case: the JSON a failure printed, or a file holding it (default: "
        "draw cases)",
        surfaces=frozenset({CHECK}),
    ),
    Option(
        "properties",
        properties_help(),
        metavar="NAME,...",
    ),
    Option(
        "contract",
        "what the cases draw: full (every feature) or cs336 (what the CS336 interfaces promise; "
        "docs/guide.md's table says feature by feature) (default %(default)s)",
        choices=("full", "cs336"),
        defaults={PYTEST: None},
    ),
    Option(
        "features",
        "comma-separated case features, each -name (never draw it) or +name (draw it again after "
        "--contract turned it off), e.g. --features -unused-some-ranks (default: none, every "
        "feature --contract draws)",
        metavar="SPEC",
    ),
    Option(
        "database",
        "directory of the failing cases: saved after each check, replayed first by the next "
        "check of the same target and dropped once they pass (default %(default)s; in pytest, "
        "under the rootdir)",
        metavar="PATH",
        defaults={CHECK: ".paracheck/examples", PYTEST: None},
    ),
    Option("no_database", "do not save or replay failing cases", bool),
    Option(
        "first_failure",
        "stop at the first failing row of the verdict table (default: fill every row)",
        bool,
        surfaces=frozenset({CHECK}),
    ),
    Option(
        "incomplete",
        "the verdict of a verdict table with rows not reached (the budget ran out): incomplete "
        "(INCOMPLETE, exit 3, as the gate's INCONCLUSIVE) or pass (the rows reached decide) "
        "(default %(default)s)",
        choices=("incomplete", "pass"),
    ),
    Option(
        "all",
        "without TARGET: every built-in, torch's DDP, ZeroRedundancyOptimizer and FSDP2 "
        "included, at the profile's examples per search (default: the main job, paracheck's own "
        "built-ins at fewer examples; the first line says which)",
        bool,
        surfaces=frozenset({CHECK}),
    ),
    Option(
        "json",
        "write the verdict, every failing case whole, as JSON to PATH ('-': stdout, instead of "
        "the text report; default: none)",
        metavar="PATH",
        surfaces=frozenset({CHECK}),
    ),
)

_FIELDS = {f.name: f for f in dataclasses.fields(CheckSettings)}
_BY_NAME = {o.name: o for o in OPTIONS}


def options(surface: str) -> tuple[Option, ...]:
    """The rows of ``OPTIONS`` that ``surface`` (check, selftest, pytest) offers."""
    return tuple(o for o in OPTIONS if surface in o.surfaces)


def _keywords(option: Option, surface: str, choices=None) -> dict:
    kw: dict = {"help": option.help}
    if option.type is bool:
        kw["action"] = "store_true"
        return kw
    kw["default"] = option.default(surface)
    if option.type is not None:
        kw["type"] = option.type
    wanted = choices if choices is not None else option.choices
    if wanted:
        kw["choices"] = list(wanted)
    if option.metavar:
        kw["metavar"] = option.metavar
    return kw


def add_arguments(parser, surface: str = CHECK, *, choices: dict | None = None) -> None:
    """Add ``surface``'s rows of ``OPTIONS`` to an argparse ``parser``; ``choices`` gives the
    choices a row leaves to the caller (``kind``: the kinds' names)."""
    for option in options(surface):
        parser.add_argument(
            option.flag, **_keywords(option, surface, (choices or {}).get(option.name))
        )


def add_pytest_options(group) -> None:
    """Add the pytest plugin's rows of ``OPTIONS`` to ``group`` as ``--paracheck-<name>``."""
    for option in options(PYTEST):
        kw = _keywords(option, PYTEST)
        kw["help"] = kw["help"].replace("%(default)s", str(option.default(PYTEST)))
        group.addoption("--paracheck-" + option.flag[2:], **kw)


# What a surface decides that none of its options sets (Note [One set of defaults]): the command
# line fills the verdict table and labels its failures; the pytest fixture searches the whole
# contract and reports every failing property, labelled.
SURFACE_SETTINGS: dict[str, dict] = {
    CHECK: dict(table=True, labels=True, first_failure=False),
    SELFTEST: {},
    PYTEST: dict(labels=True, first_failure=False),
}


def from_namespace(ns, surface: str = CHECK, **changes) -> CheckSettings:
    """The settings an argparse namespace of ``surface`` gives (its options as parsed, the
    surface's own settings, the rest the defaults), with ``changes``. Nothing is parsed or checked
    here: ``paracheck.check.plan`` does it (the world sizes stay text)."""
    values = dict(SURFACE_SETTINGS[surface])
    values.update({o.name: getattr(ns, o.name) for o in options(surface) if hasattr(ns, o.name)})
    values.update(changes)
    return CheckSettings(**values)


def from_pytest(config, **changes) -> CheckSettings:
    """The settings the pytest plugin's ``--paracheck-*`` options give (an option not given that
    has no default of its own leaves the field's), with ``changes``."""
    values = dict(SURFACE_SETTINGS[PYTEST])
    for o in options(PYTEST):
        value = config.getoption("--paracheck-" + o.flag[2:])
        if value is not None or _FIELDS[o.name].default is None:
            values[o.name] = value
    values.update(changes)
    return CheckSettings(**values)


def replay_options(settings: CheckSettings | None = None, **values) -> str:
    """The options of ``OPTIONS`` a replay command carries (``Option.replay``), where their value
    (from ``settings``, or given as keywords) is not their default: " --timeout 5"."""
    out = []
    for option in OPTIONS:
        if not option.replay:
            continue
        value = values.get(option.name, getattr(settings, option.name, None))
        if value is None or value == option.default():
            continue
        out.append(
            f" {option.flag} {value:g}" if isinstance(value, float) else f" {option.flag} {value}"
        )
    return "".join(out)


def option(name: str) -> Option:
    return _BY_NAME[name]
