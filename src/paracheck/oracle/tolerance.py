"""Every tolerance in one place: how far a correct target may differ from the oracle, per dtype
(``tolerance_for``, ``tensor_tolerance``), and how far the RMSNorm kernels may differ from
their float64 reference (``rms_norm_tolerance``).

Note [Where the differences come from]
    Rank r's local gradient is computed by the same operations, on the same inputs, in the target
    and in the oracle. What differs is the order of the sum over ranks (gloo/NCCL reduce in their
    own order; the oracle sums rank 0..W-1) and the sum over micro-steps, then one division by W.
    For n = W * accumulation terms, two summation orders differ by at most 2(n-1) u sum|g_rm|
    (u the unit roundoff), elementwise: the bound is proportional to ``grad_absum``, which the
    oracle returns. After the first step the parameters differ by the optimizer's image of that
    error, and the next step's gradients inherit it through the loss curvature; Adam divides by
    sqrt(v)+eps and can amplify a gradient difference by lr/eps. A rigorous bound for the whole
    trajectory is not tractable, so the policy is relative, per tensor:

        |got - ref| <= rtol * (|ref| + scale)   elementwise,

    with ``scale`` = max|ref| over the tensor for parameters and optimizer state, and the max of
    ``grad_absum`` over the tensor for gradients (so structurally-zero elements need no special
    case, and an element near zero is judged on the tensor's scale, not on its own).

    float64 (gloo/NCCL): rtol = 1e-10. Measured on correct targets (every built-in, ci profile,
    world sizes 1..6, up to 4 steps, SGD/momentum/Adam/AdamW, 2026-11-22): worst observed
    |got-ref|/(|ref|+scale) is 1.2e-16 for the DDP family and 3.3e-16 for ZeRO-1 (``CheckReport.
    worst_ratio``, printed by ``paracheck check``), six orders below. The smallest planted bug
    effect measured (forgetting to divide by W under AdamW, float64 parameters: 8.4e-7) is four
    orders above; gradient comparison catches it at relative error ~1.
    float32: rtol = 5e-4 for gradients, 1e-4 for parameters and state: the target computes forward
    and backward in float32 (u = 6e-8) through ~10 layers and accumulations (the oracle runs the
    same float32 computation on the CPU). Measured on gloo/CPU (2026-11-22) correct targets reach
    3.7e-5 (torch DDP, parameters) and 1.2e-5 (FlatDDP); on 2 H200s over NCCL every built-in
    passed (tests/property/test_gpu_nccl.py). The parameter margin is thin (2.7x): widen it only
    with a measurement, never to make a failure go away. A gradient scaled by W (the classic bug) is off by
    a relative (W-1)/W >= 0.5 and is caught by the gradient comparison even where Adam hides it in
    the parameters (measured: 4.8e-7 in float32 parameters, inside noise).
    bfloat16 (u = 4e-3): rtol = 5e-2 for gradients, 2e-2 for parameters.

Note [Parameters of two dtypes]
    A model may hold parameters of two dtypes (``MLPSpec.float32_layer``: one float32 layer in a
    float64 model, or a float64 layer in a float32 one, computing in its own dtype in the target
    and in the oracle alike). The tolerance is
    then per tensor and per step (``tensor_tolerance``):

    * Step 0, every tensor at its own dtype's tolerance. Both sides start from the same parameters
      and compute every local gradient by the same operations (Note [Where the differences come
      from]); what differs is the order of the rank sum, carried out in the tensor's own dtype
      (gradients have their parameter's dtype, and a DDP reduces each dtype in its own buffer).
      A float64 gradient is therefore within the float64 tolerance, and a float64 gradient that
      went through a float32 buffer (truncated: relative error ~6e-8) fails it at step 0.
    * Where the sums can differ at all, the float32 parameters differ after step 0 by float32
      rounding of their update; from step 1 on every activation downstream of them, hence every
      gradient and every parameter update, float64 ones included, inherits float32-level
      differences: every tensor is compared at the tolerance of the coarsest parameter dtype.
    * The sums can differ where more than two terms meet or the grouping can change: W >= 3, or
      W = 2 with more than one backward per step (accumulation, double backward: per-backward
      synchronisation groups (a0 + b0) + (a1 + b1), the oracle (a0 + a1) + (b0 + b1)). With W = 1
      nothing is reduced, and with W = 2 and one backward a + b = b + a and the division by 2
      is exact, so no difference arises and every step keeps each tensor's own tolerance. A
      clip's norm is another such sum, whatever W (Note [Clipping across dtypes]).
    The parameters after the step where the float32 ones first diverge are judged as at step 0
    for float64 tensors (their update used step 0's gradients only), and at float32 tolerance for
    float32 ones.
    * All of this assumes the ranks run the oracle's operations: the oracle trains on the CPU.
      Ranks on a GPU compute the float32 layer with other kernels (another summation order in
      every float32 matmul: relative differences ~1e-7), and every gradient downstream or upstream
      of it inherits them at step 0 already (measured on an H100 at world size 1, where nothing is
      reduced: torch DDP's float64 weight gradient 1.0e-8 from the oracle's, against an allowed
      1.6e-11). Off the CPU every tensor of a mixed-dtype model is therefore compared at the
      coarsest dtype's tolerance from step 0 (``same_operations=False``); a float64 gradient
      truncated to float32 is caught there only on the CPU.

Note [Autocast]
    Under autocast (``Case.autocast``) the forward computes in bfloat16 or float16 while
    parameters, gradients and their synchronisation stay float32: the compute dtype is one more
    dtype in the mix of Note [Parameters of two dtypes], and the same rule applies to it. At step 0
    (and at every step where no sum can differ) the oracle and the ranks run the same casts on the
    same parameters, so their local gradients agree and only the float32 rank sum differs: every
    tensor is judged at float32's tolerance. Once a float32 difference reaches the parameters, the
    next forward rounds them to bfloat16/float16, where a difference of one float32 ulp can move a
    value by one ulp of the compute dtype: from then on every tensor is judged at the compute
    dtype's tolerance. Off the CPU (other kernels) that holds from step 0, and so it does for a
    training loop (the ``loop`` kind), which computes its loss its own way: it may divide by the
    token count before the backward or after, inside the autocast region or out of it, and the
    gradient entering a bfloat16 matmul's backward then differs from the oracle's by float32
    rounding, enough to round one element to the neighbouring bfloat16 (measured on one H100: a
    correct bfloat16 loop 7x past float32's tolerance at step 0, world size 1, where on the CPU it
    happened to agree). A float32 gradient reduced in bfloat16 (a relative error up to 2**-9 at
    step 0) is therefore judged at float32's tolerance where it arises, in every kind but a loop.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = [
    "RMSNORM_INTERPRETER_TOLERANCES",
    "RMSNORM_TOLERANCES",
    "RMSNormTolerance",
    "TOLERANCES",
    "Tolerance",
    "UNIT_ROUNDOFF",
    "anchored",
    "gamma",
    "master_rtol",
    "rms_norm_tolerance",
    "rounding_depth",
    "state_tolerance",
    "step0_grad_rtol",
    "tensor_tolerance",
    "tolerance_for",
    "update_rtol",
]


@dataclass(frozen=True)
class Tolerance:
    grads: float
    params: float
    state: float


TOLERANCES: dict[str, Tolerance] = {
    "float64": Tolerance(grads=1e-10, params=1e-10, state=1e-10),
    "float32": Tolerance(grads=5e-4, params=1e-4, state=1e-4),
    "bfloat16": Tolerance(grads=5e-2, params=2e-2, state=2e-2),
    # float16 compute (autocast): bfloat16's entries scaled by the ratio of unit roundoffs,
    # 2**-11 / 2**-8 (Note [Autocast]).
    "float16": Tolerance(grads=6.25e-3, params=2.5e-3, state=2.5e-3),
}


def tolerance_for(dtype: str) -> Tolerance:
    if dtype not in TOLERANCES:
        raise ValueError(f"dtype={dtype!r} has no tolerance entry; known: {sorted(TOLERANCES)}")
    return TOLERANCES[dtype]


def _coarseness(dtype: str) -> float:
    tol = tolerance_for(dtype)
    return max(tol.grads, tol.params)


# Note [Gradients across devices below float32]
#   Ranks on GPUs compute their local gradients with other kernels than the CPU oracle, so the
#   derived step-0 bound (Note [Step 0: a derived bound]) does not hold for them and the
#   gradients are compared at ``TOLERANCES``, relative to the per-backward sums of |terms|. In
#   bfloat16 that is not sound: a local gradient that is itself a sum with cancellation (a bias
#   over a batch, a tied weight over its uses) differs between the two kernels by more than 5e-2
#   of that scale. Measured on one H100 (NCCL, one rank, bfloat16 cases with accumulation):
#   ``zero2`` failed 1 of ~265 cases (|diff| 3.8e-6 against 1.9e-6 allowed) and ``fsdp`` 1 of
#   ~450 (1.95e-3 against 6.8e-4); both cases pass on the CPU. So for a case below float32 on
#   GPUs the oracle computes its local gradients on the ranks' device type (Note [Local
#   gradients on the ranks' device] in ``paracheck.oracle.train``): the same kernels, and the
#   derived bound applies again. float32 and float64 cases on GPUs keep this table.
def tensor_tolerance(
    case, step: int, dtype: str, param_dtypes, *, same_operations: bool = True
) -> Tolerance:
    """The tolerance for a tensor of ``dtype`` (a ``TOLERANCES`` key) at ``step`` of ``case``,
    whose parameters have ``param_dtypes``; Note [Parameters of two dtypes]. Equal to
    ``tolerance_for(dtype)`` wherever the parameters share one dtype. ``same_operations``: the
    ranks compute their local gradients by the oracle's operations (the same device type as the
    oracle, the CPU); where they do not, a coarser dtype's rounding reaches every tensor from
    step 0 on."""
    dtypes = {str(d).removeprefix("torch.") for d in param_dtypes} | {dtype}
    if getattr(case, "autocast", None) is not None:
        dtypes.add(case.autocast)  # Note [Autocast]
    coarsest = max(dtypes, key=_coarseness)
    if coarsest == dtype:
        return tolerance_for(dtype)
    if not same_operations:
        return tolerance_for(coarsest)
    if step == 0:
        return tolerance_for(dtype)
    backwards = case.accumulation * (2 if getattr(case, "double_backward", False) else 1)
    sums_can_differ = (
        case.world_size >= 3
        or (case.world_size == 2 and backwards > 1)
        # A clip's norm is a sum of every gradient's squares, which a design may order its own
        # way (shard by shard): Note [Clipping across dtypes].
        or getattr(case, "clip_norm", None) is not None
    )
    return tolerance_for(coarsest) if sums_can_differ else tolerance_for(dtype)


def state_tolerance(case, same_operations: bool = True) -> float:
    """The tolerance of the optimizer state of ``case``: its dtype's, or, under autocast where the
    ranks run other kernels than the oracle (off the CPU), the compute dtype's (Note [Autocast]:
    a gradient computed by other bfloat16 kernels differs at bfloat16's rounding from step 0,
    and the momentum buffer of step 0 is that gradient)."""
    autocast = getattr(case, "autocast", None)
    if autocast is not None and not same_operations:
        return tolerance_for(autocast).state
    return tolerance_for(case.dtype).state


# Note [Step 0: a derived bound]
#   At step 0 on the CPU, the ranks and the oracle start from the same parameters and compute each
#   rank's local gradient of each backward by the same operations (the ranks and the oracle run
#   single-threaded), so the synchronised gradients differ only in how the n = W * backwards terms
#   are summed and divided. Any two orders of a sum of n terms, each with its own divisions by W
#   (per term, per partial sum or once; one per backward where every backward is synchronised),
#   differ elementwise by at most 2 * gamma_{2n+2} * sum|terms| (Higham, Accuracy and Stability of
#   Numerical Algorithms, 2002, section 4.2: gamma_k = k*u / (1 - k*u), u the unit roundoff of the
#   gradient's dtype, the dtype it is summed in). ``grad_absum`` is sum|terms| (before the division,
#   so W times the bound's scale: a margin of W), and the comparison's scale is its maximum over the
#   tensor, so
#
#       |got - ref| <= 2 * gamma_{2n+2} * (|ref| + max grad_absum)
#
#   holds for every correct target. Clipping multiplies by a coefficient computed from the norm of
#   every gradient element held (N of them, float32 or float64 accumulation, any order): its
#   relative difference is at most gamma_{N+4} on each side, 2 * gamma_{N+4} more (at the coarser
#   unit roundoff where the norm mixes two dtypes: Note [Clipping across dtypes]). The bound uses
#   no measured constant: float32 (u = 2**-24) with W = 4, 3 micro-steps and two backward passes
#   each gives 6.0e-6, against the fixed float32 tolerance's 5e-4; float64 gives 1.1e-14 against
#   1e-10. A float32 gradient rounded to bfloat16 for its all-reduce (relative error up to 2**-9)
#   is then caught at step 0 by a factor of 100 or more.
UNIT_ROUNDOFF = {
    "float64": 2.0**-53,
    "float32": 2.0**-24,
    "bfloat16": 2.0**-8,
    "float16": 2.0**-11,
}


def gamma(k: int, u: float) -> float:
    """Higham's gamma_k = k u / (1 - k u): the relative error bound of k roundings at unit
    roundoff u (inf where k u >= 1/2, where it bounds nothing)."""
    return k * u / (1 - k * u) if k * u < 0.5 else float("inf")


# Note [Anchored steps]
#   Below float32 a free trajectory cannot be compared tightly: once a float32 difference (the
#   rank sum's order) reaches the parameters, the next forward rounds them to bfloat16 or
#   float16, where one float32 ulp can move a value by one ulp of the compute dtype, and that
#   difference feeds back through every later step. Measured on correct targets (CPU, gloo, bf16
#   autocast, 4 steps): relative parameter differences up to 1.6e-2 against a fixed 2e-2, a margin
#   no tolerance can keep in a 10,000-case run. So a case that computes below float32 (``anchored``)
#   is compared step by step: the oracle's step k starts from the parameters (and held
#   gradients) rank 0 had after step k-1 (``paracheck.oracle.train.train(case, anchors=...)``).
#   Every step is then a step 0: the same parameters, the same local gradients, only the rank sum
#   differs, and the step-0 tolerances hold at every step (the derived gradient bound on the CPU;
#   parameters at their own dtype's tolerance). What the oracle keeps of its own is the optimizer
#   state, which a correct target's differs from by the sum of the steps' gradient differences
#   (linear in them: no feedback through the forward), and the scaler and schedules, which follow
#   the case. A wrong update still shows in the step it happens (its parameters against the
#   oracle's step from the same start), and a wrong gradient in the step it is computed; the
#   parameters' bitwise agreement across ranks is checked as before. Every property that reads the
#   oracle (optimizer state, traffic) reads the anchored trajectory.
#   A training loop (the ``loop`` kind) is anchored at every precision, and one step further: its
#   update is applied to the gradients the loop's ``optimizer.step()`` was called with. A loop
#   computes its gradients its own way (the loss divided before or after the sum), so they differ
#   from the oracle's by rounding, and Adam turns a rounding difference of a gradient element
#   near its eps (1e-8) into a parameter difference lr/(4 eps) times larger: measured on an H100,
#   a correct loop's float32 parameters 8.3e-4 from a free oracle's after one Adam step, against
#   an allowed 2.3e-4, and float64 ones 1.9e-10 (allowed 2.2e-10 at the worst element). So the
#   gradients are compared with the oracle's, and the parameters with the oracle's update of the
#   loop's own gradients: each judges one thing, and nothing amplifies.
def anchored(case) -> bool:
    """Whether ``case`` is compared step by step from the target's own parameters (Note [Anchored
    steps]): it computes below float32 (autocast, or bfloat16 parameters). A training loop is
    anchored at every precision (``paracheck.check.kinds.Kind.on_target_gradients``)."""
    return getattr(case, "autocast", None) is not None or case.dtype in ("bfloat16", "float16")


# Note [Clipping across dtypes]
#   In a model with parameters of two dtypes (Note [Parameters of two dtypes]) the clip's norm sums
#   the squares of gradients of both: torch (and the oracle, ``clip_global_norm``) computes each
#   tensor's norm in its own dtype, and a sharded design sums its shards' squares in whatever dtype
#   and order it likes. The coefficient, and with it every clipped gradient, float64 ones included,
#   then carries the coarser dtype's rounding (u_c its unit roundoff, n = W * backwards terms in
#   the rank sum, N gradient elements in the norm), on each side:
#
#   * the norm's own rounding, N + 4 roundings at u_c: gamma_{N+4}(u_c), where the single-dtype
#     bound of Note [Step 0: a derived bound] counts gamma_{N+4}(u);
#   * the coarse gradients it reads differ between the two sides by their rank sum's order, at
#     most 2 * gamma_{2n+2}(u_c) of their terms (their own step-0 bound); the norm, a 1-Lipschitz
#     function of them, moves relatively by no more where a gradient's terms are of its size.
#     In one dtype that is the gradient's own term of the bound, already counted; across dtypes
#     it is a float32 difference in a float64 gradient, counted here.
#
#   So a gradient of dtype u clipped together with gradients of a coarser dtype u_c is within
#
#       2 * gamma_{2n+2}(u) + 2 * gamma_{N+4}(u_c) + 2 * gamma_{2n+2}(u_c)
#
#   of the oracle's (relative, on the scale of Note [Step 0: a derived bound], which the oracle
#   clips by the same coefficient). A float32 layer in a float64 model with W = 3 and N = 26
#   gives 4.5e-6 (correct sharded designs used at most 0.8% of it); a coefficient computed from
#   one rank's shards only is off by the ratio of the norms (measured on the same case: a float64
#   gradient 1.3e-1 from the oracle's, where 2.3e-8 is allowed). After step 0 the float32
#   rounding has reached the parameters wherever a clip acts: every tensor is then judged at the
#   coarsest dtype's tolerance, as where the rank sum's order can differ (``tensor_tolerance``).
def step0_grad_rtol(case, dtype: str, n_elements: int, clip_dtype: str | None = None) -> float:
    """The derived tolerance of a synchronised gradient of ``dtype`` at step 0 on the CPU (Note
    [Step 0: a derived bound]); ``n_elements`` bounds the gradient elements a clip's norm sums,
    ``clip_dtype`` is the coarsest dtype among them (default ``dtype``; Note [Clipping across
    dtypes])."""
    u = UNIT_ROUNDOFF[dtype]
    backwards = case.accumulation * (2 if getattr(case, "double_backward", False) else 1)
    n = case.world_size * backwards
    rtol = 2 * gamma(2 * n + 2, u)
    if getattr(case, "clip_norm", None) is not None:
        u_c = max(u, UNIT_ROUNDOFF[clip_dtype or dtype])
        rtol += 2 * gamma(n_elements + 4, u_c)
        if u_c > u:
            rtol += 2 * gamma(2 * n + 2, u_c)
    return rtol


# Note [Comparing an update]
#   Where a step is judged on the target's own gradients (a sharding kind's or a training loop's
#   step, whose gradients the rank recorded, and every master weight: Note [Comparing master
#   weights]), the oracle's
#   step k starts from rank 0's parameters after step k-1, applies its update to the gradients
#   the target's step recorded, and holds optimizer state built by the same formula from the
#   target's recorded gradients of steps 0..k. Both sides then evaluate the same elementwise
#   formula on the same inputs in the tensor's dtype (u its unit roundoff); a correct design
#   differs only by rounding (another order of the operations, fused ones, another device's
#   kernels). Elementwise (torch's single-tensor Adam rounds 15 times a step, the lr and bias
#   correction scalars counted; SGD with momentum and weight decay 5):
#
#   * p' = p - lr * d (AdamW first p * (1 - lr * wd)): the subtraction and the decay round
#     relative to |p| and |p'|.
#   * SGD: d = b_k = mu * b_{k-1} + g_k + wd * p, a linear recurrence (b_0 = g_0 + wd * p): its
#     rounding error is at most (roundings) * u times the same recurrence run on magnitudes,
#     B_k = mu * B_{k-1} + |g_k| + wd * |p|, whatever cancellation makes b small.
#   * Adam, AdamW: d = m_hat / (sqrt(v_hat) + eps). v is a sum of non-negative terms (relative
#     error a few (k+1) u); m is signed, its error a few (k+1) u times max_j |g_j|; and after
#     n + 1 steps v_hat >= (1 - beta2) * beta2**n * g_j**2 for every gradient g_j it holds (the
#     bias correction divides by at most 1), so |g_j| / sqrt(v_hat) <= C = ((1 - beta2) *
#     beta2**n) ** -0.5 (10.2 to 31.7 for the betas drawn): the error of d is at most a few
#     (k+1) u C, and |d| <= C, whatever the gradients' size. Adam's L2 weight decay is a term of
#     g here.
#
#   So with at most 16 roundings a step on each side (k + 1 steps of state behind step k),
#
#       |got - ref| <= 2 * gamma_{16(k+1)} * (|ref| + S)   elementwise,
#       S = max over the tensor of |ref|, |p before the step|, and lr * B (SGD) or lr * C (Adam)
#
#   (``update_rtol``; the oracle records lr * B or lr * C per tensor and step as
#   ``StepRecord.update_scale``). No measured constant enters: float32 gives 1.9e-6 at step 0 and
#   7.6e-6 at step 3, against the fixed tolerance's 1e-4 for a free trajectory; float64 3.6e-15
#   against 1e-10. Below float32 the fixed tolerance (2e-2 for bfloat16) is the smaller and
#   stands: 2 * gamma_16 is 0.13 at u = 2**-8. A step the ranks take wrong (lost optimizer state,
#   an unstepped group, another rank's parameters) is judged against this bound in the step it
#   happens, instead of against a tolerance sized for a whole free trajectory.


# Note [Comparing master weights]
#   A target's float32 masters (Note [Master weights] in ``paracheck.cases``) after step k are
#   compared with the oracle's step from the same start: the oracle's step k begins at rank 0's
#   masters after step k-1 (anchored, like every step of a bfloat16 case: Note [Anchored steps])
#   and its update is applied to the gradients the target's step used, as the target recorded
#   them (``train(..., target_gradients=True)``; the gradients themselves are judged against the
#   oracle's by the gradients property). That is Note [Comparing an update] at u = 2**-24: 1.9e-6
#   at step 0. A master kept in bfloat16 is off by its own rounding (up to 2**-9 of it) or, where
#   the update is below half its ulp, by the whole update: lr * |g|, which at lr 1e-3 and
#   gradients of 1e-2 is already 10 times the bound at a master of 0.5. Masters are compared only
#   at steps whose gradients the target recorded (without them the oracle's own gradients would
#   differ from the target's at bfloat16's rounding).
#
#   Each parameter must also be its master rounded, at every step and on every rank: one of the
#   two values of the parameter's dtype that bracket the master (the master itself where it is
#   representable). Any rounding rule a design may use (to nearest, toward zero, stochastic)
#   lands there; a parameter left at the last step's rounding, or gathered before the masters
#   were rounded into it, lands there only where the step moved the master by less than the gap
#   between two bfloat16 values. An exact rule, reported as ``master-weights``.
def update_rtol(step: int, dtype: str) -> float:
    """The relative tolerance of a tensor of ``dtype`` after step ``step``, stepped from the
    target's own parameters and gradients (Note [Comparing an update])."""
    return 2 * gamma(16 * (step + 1), UNIT_ROUNDOFF[dtype])


def rounding_bracket(master: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """The two values of ``dtype`` nearest ``master`` on either side, elementwise (equal where
    ``master`` is representable): the values a parameter kept as its master rounded may take
    (Note [Comparing master weights])."""
    nearest = master.to(dtype)
    direction = torch.where(
        master > nearest.to(master.dtype),
        torch.tensor(float("inf"), dtype=dtype),
        torch.tensor(float("-inf"), dtype=dtype),
    )
    exact = master == nearest.to(master.dtype)
    other = torch.where(exact, nearest, torch.nextafter(nearest, direction))
    return nearest, other


def master_rtol(step: int) -> float:
    """The relative tolerance of a float32 master weight after step ``step`` (Note [Comparing
    master weights])."""
    return update_rtol(step, "float32")


# -- the RMSNorm kernels against the float64 reference (paracheck.oracle.rmsnorm) ----------------


@dataclass(frozen=True)
class RMSNormTolerance:
    """How far an output of storage dtype ``dtype`` may be from the float64 reference.

    For an output element with reference ``r`` and error scale ``s`` (the sum of the absolute
    values of the terms that make it, so cancellation is accounted for; ``s = |r|`` for the
    forward), the bound is ``output_rel * |r| + 2 * k * u * s + atol`` where ``u = 2**-24`` is
    float32's unit roundoff (all arithmetic is float32), ``k`` counts the roundings on the
    longest path (see ``rounding_depth``) and the factor 2 is slack for second-order terms.
    """

    output_rel: float  # rounding of the float32 result into the storage dtype
    atol: float  # below the dtype's smallest normal number, relative accuracy is lost


_U32 = 2.0**-24


def rounding_depth(n: int) -> int:
    """Roundings on the longest path of a length-``n`` float32 sum, plus the pointwise ops.

    Triton's ``tl.sum`` adds each thread's own values in sequence (at most 32 per thread for
    the launch plans used with n <= 16384, 128 up to MAX_WIDTH) and then combines threads in a
    tree; numpy (the interpreter) sums pairwise in blocks of 8. A sum of non-negative-scale terms
    computed by any tree of depth t has relative error <= t*u, so t <= 128 + log2(n), capped by
    the n-1 of plain recursive summation. The +8 covers sqrt, division and the 3-4 products and
    subtraction around the sums.
    """
    return min(n - 1, 128 + max(1, n - 1).bit_length()) + 8


RMSNORM_TOLERANCES: dict[torch.dtype, RMSNormTolerance] = {
    # float32 storage: the result is already float32; nothing is added by storing it. atol is
    # float32's smallest normal (the GPU may flush subnormal intermediates to zero).
    torch.float32: RMSNormTolerance(output_rel=0.0, atol=2.0**-126),
    # bfloat16 (8 significant bits): round-to-nearest on the GPU costs half an ulp, 2**-8
    # relative. The Triton INTERPRETER truncates float32 -> bfloat16 instead of rounding
    # (measured on triton 3.x), which costs up to one full ulp, 2**-7 relative; the interpreter entry below
    # allows that. The reference itself is the exact float64 value, not its bf16 rounding.
    torch.bfloat16: RMSNormTolerance(output_rel=2.0**-8, atol=2.0**-126),
    # float16 (11 significant bits): half an ulp is 2**-11 relative above the smallest normal
    # 2**-14; below it the spacing is the fixed 2**-24, so atol is that spacing.
    torch.float16: RMSNormTolerance(output_rel=2.0**-11, atol=2.0**-24),
}

# Under TRITON_INTERPRET=1 (CPU), float32 -> bfloat16 truncates: one ulp instead of half.
RMSNORM_INTERPRETER_TOLERANCES: dict[torch.dtype, RMSNormTolerance] = {
    **RMSNORM_TOLERANCES,
    torch.bfloat16: RMSNormTolerance(output_rel=2.0**-7, atol=2.0**-126),
}


def rms_norm_tolerance(dtype: torch.dtype, *, interpreted: bool) -> RMSNormTolerance:
    """The tolerance for outputs stored in ``dtype``, on the GPU or in the interpreter."""
    table = RMSNORM_INTERPRETER_TOLERANCES if interpreted else RMSNORM_TOLERANCES
    return table[dtype]
