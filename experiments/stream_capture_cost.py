"""Host cost of capturing the current CUDA stream, as a hook does once per launch it hands to the
launcher thread (Note [Launching off the autograd thread]): ``torch.cuda.current_stream()``
against the raw ``(stream_id, device_index, device_type)`` tuple, and setting each in a thread.

    PYTHONPATH=src python experiments/stream_capture_cost.py [--calls 20000] [--rounds 7]

Prints per-call microseconds, median (min-max) over rounds, the two interleaved.
"""

import argparse
import statistics
import time

import torch

from paracheck.ddp._launch import _current_stream, _make_current


def _per_call(fn, calls: int) -> float:
    t = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t) / calls * 1e6


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--calls", type=int, default=20000)
    p.add_argument("--rounds", type=int, default=7)
    args = p.parse_args()
    torch.cuda.init()
    side = torch.cuda.Stream()
    obj, raw = torch.cuda.current_stream(), _current_stream()

    def set_object():
        torch.cuda.set_device(obj.device)
        torch.cuda.set_stream(obj)

    cases = {
        "capture: torch.cuda.current_stream()": torch.cuda.current_stream,
        "capture: raw tuple": _current_stream,
        "compare: Stream objects": lambda: obj != side,
        "compare: tuples": lambda: raw != (0, 0, 0),
        "set: set_device + set_stream": set_object,
        "set: raw (the launcher's)": lambda: _make_current(raw),
    }
    times = {k: [] for k in cases}
    for _ in range(args.rounds):
        for name, fn in cases.items():
            times[name].append(_per_call(fn, args.calls))
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; us per call")
    for name, ts in times.items():
        print(f"  {name:40s} {statistics.median(ts):6.2f} ({min(ts):.2f}-{max(ts):.2f})")


if __name__ == "__main__":
    main()
