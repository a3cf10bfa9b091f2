"""The check, driven by Hypothesis: generate cases, run each once, find every failing property,
shrink each on its own, label it with the case features it needs.

Note [One search per property]
    A case breaks one property or several (``CaseResult.failed_properties``). One Hypothesis search
    runs until a case breaks a property not reported yet; from then on that search's test fails only
    on cases that break *that* property, so Hypothesis shrinks it alone, and the next search looks
    for the next new property. Every case runs at most once (results are cached by the case's JSON),
    so the later searches replay the earlier ones' cases for free and only generate new ones after
    them: a target with k failing properties costs about one full pass plus k shrinks. A failure
    that needs a feature (``paracheck.check.features``) can hide another bug in the cases without it,
    so each needed feature also gets a search over cases without it (``search_without``).

    Before any search, the cases saved by earlier checks of the target run first (Note [Saved
    cases] in ``paracheck.check.database``); the failing cases of this check are saved after it.
    The features turned off (``contract``, ``features``: ``paracheck.check.features``) are removed
    from every drawn case, so neither a search, nor labelling (which only removes features), nor
    the searches without a needed feature, nor a replayed case brings one back.

Note [Hang timeouts]
    The timeout of a case is 10x the slowest passing case of its world size so far, at least
    ``floor`` seconds and at most the World's timeout (``CaseTimeouts``). Before a case of some size
    has passed, it is extrapolated from the other sizes, or is the World's timeout. A deadlock the
    ranks' collective counts prove is reported before any timeout (``paracheck.world``), so most
    hangs cost well under a second, and a stall (no rank of the case runs: Note [Timeout verdicts]
    in ``paracheck.world._collect``) a few seconds; shrinking a hang and labelling the features it
    needs share one budget of ``hang_shrink_seconds`` from the moment it is found, after which the
    smallest hang found is reported as not fully shrunk (and its labels as incomplete). A dead
    rank's shrinking and labelling are bounded by that budget each.
"""

from __future__ import annotations

from paracheck.cases import Case
from paracheck.check.plan import DTYPE_PRECISIONS, CheckPlan, plan_target
from paracheck.check.report import CheckReport, PropertyFailure, replay_command
from paracheck.check.search import (
    BudgetSpent,
    CaseTimeouts,
    Progress,
    declared_features,
    sequence_name,
)
from paracheck.check.settings import PROFILES, CheckSettings
from paracheck.check.shared_search import _Search, declared_mismatch
from paracheck.check.table import fill_table
from paracheck.check.targets import Target
from paracheck.world import World

__all__ = [
    "CheckReport",
    "PropertyFailure",
    "CaseTimeouts",
    "Progress",
    "check_target",
    "BudgetSpent",
    "CheckSettings",
    "DTYPE_PRECISIONS",
    "declared_features",
    "declared_mismatch",
    "sequence_name",
    "replay_command",
    "PROFILES",
]


def check_target(
    target: Target,
    world: World,
    settings: CheckSettings | CheckPlan | None = None,
    *,
    strategy=None,
    device_fn=None,
    explicit: list[Case] = (),
    progress=None,
    on_failure=None,
    on_row=None,
    **changes,
) -> CheckReport:
    """Check ``target`` as ``settings`` say (``paracheck.check.settings.CheckSettings``), changed
    by the keywords (any field: ``world_sizes=(1, 2)``, ``max_examples=8``), and report what it
    breaks. One signature, one set of defaults, the fields' (Note [One set of defaults]): what a
    pytest user expects, one search over the whole contract (Note [One search per property])
    stopping at the first failing property, unlabelled, no time budget, seed 0 and the ci
    profile's 40 examples, ``DEFAULT_WORLD_SIZES`` on gloo (``paracheck.check.plan``), no example
    database, the World's hang timeout. ``table=True`` fills the command line's verdict table
    instead (Note [The verdict table] in ``paracheck.check.table``), within ``budget`` seconds;
    ``first_failure=False`` goes on after the first failing property, ``labels=True`` works out
    the case features each failure needs and, with ``search_without``, searches the cases without
    them too. Settings that cannot run are an ``InvalidArgument`` naming the field. A
    ``CheckPlan`` (``paracheck.check.plan``) is checked as planned.

    ``strategy`` replaces the kind's; ``explicit`` cases run first, as given; ``on_failure(failure)``
    is called with each failure the moment it is found, and ``on_row(row, index, rows)`` with each
    row of the table as it is filled.

    ``seed`` makes the run reproducible: 0 is Hypothesis's derandomised sequence (the ci profile,
    the selftest and paracheck's own tests), any other value ``hypothesis.seed(seed)``; None draws
    at random. ``database`` (a directory, a ``CaseDatabase`` or None) saves the failing cases and
    replays the saved ones first (Note [Saved cases]). ``contract`` (``"full"`` or ``"cs336"``)
    and ``features`` (``"-name,+name"``) choose the features drawn; ``dtype`` (default float64,
    float32 for a ``loop`` target) the parameters' dtype; ``precision`` (``fp64``,
    ``fp32``, ``bf16``, ``fp16`` or ``mixed``: Note [Precision from the seed]) replaces ``dtype``
    (``paracheck.check.feature_choice.features_off``). ``timeout`` caps every case's hang timeout
    (default: the World's); see Note [Hang timeouts] for the timeout of each case.
    """
    if isinstance(settings, CheckPlan) and not changes:
        planned = settings  # planned already (the command line's), not planned again
    else:
        base = settings.settings if isinstance(settings, CheckPlan) else settings
        planned = plan_target((base or CheckSettings()).replace(**changes), target)
    search = _Search(target, world, planned, strategy, device_fn, progress, on_failure)
    search.on_row = on_row
    if search.settings.table:
        return fill_table(search, explicit)
    return search.whole_contract(explicit)
