"""A case: everything one equivalence check needs, as a frozen, picklable, JSON-able value.

The driver sends a ``Case`` (never a model) to every rank; each rank and the oracle rebuild the
same model and the same batches from it. See Note [Determinism]
(``paracheck.cases._protocol``).

The package's modules: the value (``_case``: ``Case`` and its constants), its optimizer
(``_optimizer``: ``OptimizerSpec``, ``GroupSpec`` and how a case's optimizer and scheduler are
built), the training protocol (``_protocol``: seeds, model, batches, losses) and its precision
(``_precision``: autocast and loss scaling).
"""

# Besides ``__all__``, the ranks, the oracle and the targets import the other names here from
# ``paracheck.cases``.
from paracheck.cases._case import (  # noqa: F401
    AUTOCAST_DTYPES,
    DELAY_POINTS,
    DTYPES,
    IGNORE_INDEX,
    LOSSES,
    Case,
)
from paracheck.cases._compile import COMPILE_SETTINGS, CompileSetting  # noqa: F401
from paracheck.cases._optimizer import (  # noqa: F401
    SCHEDULERS,
    GroupSpec,
    OptimizerSpec,
    add_late_groups,
    apply_lr_schedule,
    build_optimizer,
    build_scheduler,
    param_groups,
    params_in_groups,
    step_scheduler,
)
from paracheck.cases._precision import (  # noqa: F401
    BACKOFF,
    GROWTH_INTERVAL,
    build_grad_scaler,
    forward_context,
)
from paracheck.cases._protocol import (  # noqa: F401
    batch_for,
    build_case_model,
    init_seed,
    loss_fn,
    micro_batches,
    step_loss,
    valid_tokens,
)

__all__ = [
    "Case",
    "GroupSpec",
    "OptimizerSpec",
    "batch_for",
    "build_optimizer",
    "build_scheduler",
    "IGNORE_INDEX",
    "LOSSES",
    "micro_batches",
    "step_loss",
    "valid_tokens",
    "step_scheduler",
    "init_seed",
    "AUTOCAST_DTYPES",
    "DTYPES",
    "DELAY_POINTS",
    "SCHEDULERS",
    "build_grad_scaler",
    "forward_context",
]
