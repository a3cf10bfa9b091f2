"""One training step of every variant on 2 gloo ranks, torch DDP and ZeroRedundancyOptimizer
beside them: the 'cpu' LM (4.2 M parameters), batch 4 x 64 tokens per rank, 25 MB buckets."""

from paracheck.bench.asvtools import key, measure_steps, require

MODEL = "cpu"
VARIANTS = [
    "local",
    "naive",
    "flat",
    "overlapped",
    "bucketed",
    "torch-ddp",
    "sharded",
    "zero1",
    "torch-zero",
]


def measure(*_):
    return measure_steps(device="cpu", models=[MODEL], variants=VARIANTS)


measure.timeout = 900


class StepTime:
    """Wall time (median of 8 steps) and CPU time (least of 8) of a step, slowest rank."""

    params = [VARIANTS]
    param_names = ["variant"]
    setup_cache = measure
    timeout = 900

    def setup(self, results, variant):
        self.r = require(results, key(MODEL, variant))

    def track_wall(self, results, variant):
        return self.r["median"]

    track_wall.unit = "seconds"

    def track_cpu(self, results, variant):
        return self.r["cpu_min"]

    track_cpu.unit = "seconds"


class StepMemory:
    """Exact tensor bytes per rank (peaks by phase, optimizer state) and the noisy rank RSS peak."""

    params = [VARIANTS]
    param_names = ["variant"]
    setup_cache = measure
    timeout = 900

    def setup(self, results, variant):
        self.r = require(results, key(MODEL, variant))

    def track_tensor_params(self, results, variant):
        return self.r["account"]["param_bytes"]

    track_tensor_params.unit = "bytes"

    def track_tensor_grads(self, results, variant):
        return self.r["account"]["grad_bytes"]

    track_tensor_grads.unit = "bytes"

    def track_tensor_peak_init(self, results, variant):
        return self.r["account"]["peak_init_bytes"]

    track_tensor_peak_init.unit = "bytes"

    def track_tensor_peak_before_step(self, results, variant):
        return self.r["account"]["peak_before_step_bytes"]

    track_tensor_peak_before_step.unit = "bytes"

    def track_tensor_peak_step(self, results, variant):
        return self.r["account"]["peak_step_bytes"]

    track_tensor_peak_step.unit = "bytes"

    def track_optimizer_state(self, results, variant):
        return self.r["account"]["optimizer_state_bytes"]

    track_optimizer_state.unit = "bytes"

    def track_rank_rss_peak(self, results, variant):
        return self.r["rss_peak"]

    track_rank_rss_peak.unit = "bytes"


class StepTraffic:
    """Exact communication per rank and step: collectives, payload bytes, bus bytes."""

    params = [VARIANTS]
    param_names = ["variant"]
    setup_cache = measure
    timeout = 900

    def setup(self, results, variant):
        self.r = require(results, key(MODEL, variant))

    def track_collectives(self, results, variant):
        return self.r["account"]["collectives"]

    track_collectives.unit = "collectives"

    def track_payload_bytes(self, results, variant):
        return self.r["account"]["payload_bytes"]

    track_payload_bytes.unit = "bytes"

    def track_bus_bytes(self, results, variant):
        return self.r["account"]["bus_bytes"]

    track_bus_bytes.unit = "bytes"


class StepHostCost:
    """Exact host cost per rank and step (Note [Host cost per step] in
    paracheck.accounting.record): operators dispatched, launches (operators that compute: kernel
    launches on a GPU), tensor allocations, Python hook calls."""

    params = [VARIANTS]
    param_names = ["variant"]
    setup_cache = measure
    timeout = 900

    def setup(self, results, variant):
        self.r = require(results, key(MODEL, variant))

    def track_operators(self, results, variant):
        return self.r["account"]["operators"]

    track_operators.unit = "operators"

    def track_launches(self, results, variant):
        return self.r["account"]["launches"]

    track_launches.unit = "launches"

    def track_allocations(self, results, variant):
        return self.r["account"]["allocations"]

    track_allocations.unit = "allocations"

    def track_hook_calls(self, results, variant):
        return self.r["account"]["hooks"]

    track_hook_calls.unit = "hook calls"


class StepSchedule:
    """The exact communication schedule of a step (Note [Communication schedule of a step] in
    paracheck.accounting.schedule), per rank: what is launched after backward, waits inside
    backward, device syncs, exposed communication under the stated links, host calls."""

    params = [VARIANTS]
    param_names = ["variant"]
    setup_cache = measure
    timeout = 900

    def setup(self, results, variant):
        self.r = require(results, key(MODEL, variant))
        if "launches_after_backward" not in self.r["account"]:
            raise NotImplementedError("this commit records no communication schedule")

    def track_launches_after_backward(self, results, variant):
        return self.r["account"]["launches_after_backward"]

    track_launches_after_backward.unit = "collectives (lower is better)"

    def track_bytes_after_backward(self, results, variant):
        return self.r["account"]["bytes_after_backward"]

    track_bytes_after_backward.unit = "bytes"

    def track_waits_in_backward(self, results, variant):
        return self.r["account"]["waits_in_backward"]

    track_waits_in_backward.unit = "waits (lower is better)"

    def track_device_syncs(self, results, variant):
        return self.r["account"]["device_syncs"]

    track_device_syncs.unit = "syncs (lower is better)"

    def track_exposed_share_balanced(self, results, variant):
        return self.r["account"]["exposed_comm_pct_balanced"]

    track_exposed_share_balanced.unit = (
        "percent of backward exposed, balanced link (lower is better)"
    )

    def track_exposed_pcie4(self, results, variant):
        return self.r["account"]["exposed_comm_us_pcie4"] / 1e6

    track_exposed_pcie4.unit = "seconds"

    def track_exposed_nvlink_h100(self, results, variant):
        return self.r["account"]["exposed_comm_us_nvlink_h100"] / 1e6

    track_exposed_nvlink_h100.unit = "seconds"

    def track_host_calls(self, results, variant):
        return self.r["account"]["host_calls"]

    track_host_calls.unit = "host calls (lower is better)"
