"""Plots of the latest measurements, each naming the commit and the machine it was measured on;
see ``paracheck.report``."""

from __future__ import annotations

import glob
import html
import itertools
import json
import os
import re

__all__ = ["collect", "plot_all"]


def _asv_latest(results_dir: str) -> list[dict]:
    """The newest result file of each machine, as {name: {params tuple: value}} with params."""
    out = []
    for machine_dir in sorted(glob.glob(os.path.join(results_dir, "*", ""))):
        files = [
            f
            for f in glob.glob(os.path.join(machine_dir, "*.json"))
            if not f.endswith("machine.json")
        ]
        if not files:
            continue
        newest = max(files, key=lambda f: json.load(open(f)).get("date", 0))
        from asv.results import Results

        res = Results.load(newest)
        values = {}
        for name in sorted(res.get_all_result_keys()):
            params = res.get_result_params(name)
            vals = res.get_result_value(name, params)
            values[name] = {
                tuple(p): v for p, v in zip(itertools.product(*params), vals) if v is not None
            }
        out.append(
            {
                "machine": os.path.basename(os.path.dirname(machine_dir)),
                "file": newest,
                "values": values,
                "commit": res.commit_hash or "",
            }
        )
    return out


def _unquote(p: str):
    p = p.strip()
    if len(p) >= 2 and p[0] == p[-1] and p[0] in "'\"":
        return p[1:-1]
    try:
        return float(p)
    except ValueError:
        return p


def _model_name(model: dict) -> str:
    """The suite's name of an LM spec dict (``cpu``, ``xl``, ...), else its shape."""
    from dataclasses import asdict

    from paracheck.bench.suites import CPU_MODELS, GPU_SIZES, model_for

    for name in (*CPU_MODELS, *GPU_SIZES, "2.7B"):
        if asdict(model_for(name)) == model:
            return name
    return f"d{model['d_model']}x{model['num_layers']}"


def _where(machine: str, commit: str | None) -> str:
    """How a plot names where a measurement comes from: the commit and the machine."""
    if not commit:
        return f"unknown commit on {machine}"
    dirty = " with uncommitted changes" if commit.endswith("-dirty") else ""
    return f"commit {commit[:10]}{dirty} on {machine}"


def _history(history: str | None, repo: str | None = None) -> list[tuple]:
    """Every reading of a history that ``paracheck gate`` or ``paracheck bench --history``
    recorded (Note [History without asv configuration] in ``paracheck.report.store``), as
    (benchmark, unit, variant, machine, commit, order, value). ``order`` sorts the commits as
    asv's pages do, by ``git rev-list --all --date-order`` in ``repo`` (commit dates are whole
    seconds: two commits of one second would tie), then by commit date."""
    import subprocess

    from paracheck.report.store import measurements

    if not history:
        return []
    listed = (
        subprocess.run(
            ["git", "-C", repo, "rev-list", "--all", "--date-order", "--reverse"],
            capture_output=True,
            text=True,
        ).stdout.split()
        if repo
        else []
    )
    position = {sha: i for i, sha in enumerate(listed)}
    return [
        (
            name,
            b["unit"],
            variant,
            d["machine"]["machine"],
            d["commit"],
            (position.get(d["commit"], len(position)), d["date"]),
            value,
        )
        for d in measurements(history)
        for name, b in d["benchmarks"].items()
        for variant, value in b["values"].items()
    ]


def collect(
    results_dir: str | None, json_files, history: str | None = None, repo: str | None = None
) -> dict:
    """Series for the plots: ``allreduce`` [(label, W, MB, busbw GB/s)], ``bucket``
    [(label, MB, step ms)], ``memory`` [(label, variant, dict)]; every label ends with
    ``_where``'s commit and machine; ``history``: the readings of ``history`` in ``repo``
    (``_history``)."""
    data: dict = {
        "allreduce": [],
        "bucket": [],
        "memory": [],
        "history": _history(history, repo),
    }
    for path in json_files:
        with open(path) as f:
            rec = json.load(f)
        machine = rec.get("machine", {})
        where = _where(
            machine.get("gpu") or machine.get("host") or os.path.basename(path),
            machine.get("commit"),
        )
        for r in rec.get("allreduce", []):
            data["allreduce"].append(
                (f"{r['backend']}, {where}", r["world_size"], r["size_mb"], r["busbw"] / 1e9)
            )
        for r in rec.get("bucket", []):
            data["bucket"].append(
                (
                    f"{r['spec']['variant']}, {_model_name(r['spec']['model'])} LM, {where}",
                    r["spec"]["bucket_mb"],
                    r["median"] * 1e3,
                )
            )
        for r in rec.get("step", []):
            if "error" in r:
                continue
            label = f"{_model_name(r['spec']['model'])} LM, {where}"
            entry = dict(r.get("account") or {})
            if r.get("cuda_memory"):
                entry["cuda"] = r["cuda_memory"]
            data["memory"].append((label, r["spec"]["variant"], entry))
        for r in rec.get("memory", []):
            data["memory"].append(
                (f"{_model_name(r['spec']['model'])} LM, {where}", r["spec"]["variant"], r)
            )
    for run in _asv_latest(results_dir) if results_dir and os.path.isdir(results_dir) else []:
        v = run["values"]
        where = _where(f"asv machine {run['machine']}", run["commit"])
        for tier, backend in (("cpu", "gloo"), ("gpu", "nccl")):
            # Recorded as seconds per bus GB (lower is better, for asv); plotted as GB/s. Result
            # files written before that recorded GB/s as track_busbw.
            for (w, mb), inv in v.get(
                f"{tier}.allreduce.AllReduce.track_seconds_per_bus_gb", {}
            ).items():
                if inv and inv == inv:
                    data["allreduce"].append(
                        (f"{backend}, {where}", int(_unquote(w)), _unquote(mb), 1.0 / inv)
                    )
            for (w, mb), bw in v.get(f"{tier}.allreduce.AllReduce.track_busbw", {}).items():
                data["allreduce"].append(
                    (f"{backend}, {where}", int(_unquote(w)), _unquote(mb), bw)
                )
        for tier in ("cpu", "gpu"):
            model = "cpu" if tier == "cpu" else "xl"
            for (var, mb), t in v.get(f"{tier}.bucket.BucketSweep.track_wall", {}).items():
                data["bucket"].append(
                    (f"{_unquote(var)}, {model} LM, {where}", _unquote(mb), t * 1e3)
                )
        mem: dict = {}
        for q, field in (
            ("track_tensor_params", "param_bytes"),
            ("track_tensor_grads", "grad_bytes"),
            ("track_optimizer_state", "optimizer_state_bytes"),
            ("track_tensor_peak_before_step", "peak_before_step_bytes"),
            ("track_tensor_peak_step", "peak_step_bytes"),
            ("track_tensor_peak_init", "peak_init_bytes"),
        ):
            for (var,), value in v.get(f"cpu.step.StepMemory.{q}", {}).items():
                mem.setdefault(_unquote(var), {})[field] = value
        for var, entry in mem.items():
            if {"param_bytes", "grad_bytes", "optimizer_state_bytes"} <= entry.keys():
                entry["peak_bytes"] = max(
                    entry.get(k, 0)
                    for k in ("peak_init_bytes", "peak_before_step_bytes", "peak_step_bytes")
                )
                data["memory"].append((f"cpu LM, {where}", var, entry))
    return data


# -- plots --------------------------------------------------------------------------------------
def _sources(labels) -> str:
    """The commits and machines behind a plot's series (the part of each label after ', commit'
    or ', unknown commit'), for its title."""
    found = sorted({re.sub(r"^.*?, (?=(commit|unknown commit) )", "", a) for a in labels})
    return "; ".join(found)


def _bucket_fit(pts):
    """Note [Bucket-size model] fitted to one series, or None where it has fewer than three
    bucket sizes."""
    from paracheck.bench.bucket_model import fit_bucket_model

    if len({mb for mb, _ in pts}) < 3:
        return None
    return fit_bucket_model(pts)


def bucket_model_table(fits) -> str:
    """A Markdown table of fitted bucket models: per series (label, [(MB, ms)], BucketFit), the
    coefficients, the best bucket size the model predicts and the best one measured."""
    out = [
        "| series | sizes | c (ms) | 1/w (ms per MB) | o S (ms MB) | predicted best (MB) "
        "| measured best (MB) | residual rms (ms) |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for label, pts, fit in fits:
        best = fit.best_mb
        measured = min(pts, key=lambda p: p[1])[0]
        out.append(
            f"| {label} | {len(pts)} | {fit.c_ms:.3g} | {fit.per_mb_ms:.3g} | "
            f"{fit.overhead_ms_mb:.3g} | {'none' if best is None else f'{best:.3g}'} | "
            f"{measured:g} | {fit.rms_ms:.2g} |"
        )
    return "\n".join(out) + "\n"


def plot_all(data: dict, out: str) -> list[str]:
    """Write the PNGs for whatever ``data`` holds; returns their file names."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(out, exist_ok=True)
    written = []
    if data["allreduce"]:
        written += _plot_allreduce(plt, data["allreduce"], out)
    if data["bucket"]:
        written += _plot_buckets(plt, data["bucket"], out)
    written += _plot_memory(plt, data["memory"], out)
    if data.get("history"):
        written += _plot_history(plt, data["history"], out)
    _write_index(out, written)
    return written


def _plot_history(plt, readings: list, out: str) -> list[str]:
    """Per step-time benchmark of a recorded history, its value at every recorded commit (in the
    order asv places them), a point per variant and machine; the exact quantities that changed
    between commits as a table."""
    order = sorted({(key, commit) for *_, commit, key, _ in readings})
    x_of = {commit: i for i, (_, commit) in enumerate(order)}
    ticks = [commit[:8] for _, commit in order]
    written = []
    for name in sorted({r[0] for r in readings if ".step." in r[0]}):
        rows = [r for r in readings if r[0] == name]
        fig, ax = plt.subplots(figsize=(max(6.0, 0.8 * len(order) + 3), 4.5))
        for variant, machine in sorted({(r[2], r[3]) for r in rows}):
            pts = sorted((x_of[r[4]], r[6]) for r in rows if (r[2], r[3]) == (variant, machine))
            # Points, no line: commits in this order may lie on different branches, and a line
            # from one branch's commit to another's would draw a change that no commit made.
            ax.plot(
                [p[0] for p in pts],
                [p[1] for p in pts],
                marker="o",
                linestyle="none",
                label=f"{variant}, {machine}",
            )
        ax.set_xticks(range(len(order)), ticks, rotation=30, ha="right")
        ax.set(
            xlabel="recorded commit (oldest first)",
            ylabel=rows[0][1],
            title=f"{name} at every recorded commit\n"
            + ", ".join(sorted({f"machine {r[3]}" for r in rows})),
        )
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fname = "history_" + re.sub(r"[^A-Za-z0-9_.-]", "_", name) + ".png"
        fig.savefig(os.path.join(out, fname), dpi=110)
        plt.close(fig)
        written.append(fname)
    changed = []
    for name, variant, machine in sorted({(r[0], r[2], r[3]) for r in readings}):
        if ".step." in name:
            continue
        values = sorted(
            (x_of[r[4]], r[6]) for r in readings if (r[0], r[2], r[3]) == (name, variant, machine)
        )
        if len({v for _, v in values}) > 1:
            shown = ", ".join(f"{ticks[i]}: {v:,.0f}" for i, v in values)
            changed.append(f"| {name} | {variant} | {machine} | {shown} |")
    if changed:
        with open(os.path.join(out, "history_changes.md"), "w") as f:
            f.write(
                "Exact quantities that changed between recorded commits (lower is better)\n\n"
                "| quantity | variant | machine | per commit, oldest first |\n"
                "| --- | --- | --- | --- |\n" + "\n".join(changed) + "\n"
            )
        written.append("history_changes.md")
    return written


def _plot_allreduce(plt, allreduce: list, out: str) -> list[str]:
    """All-reduce bus bandwidth against message size."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, w in sorted({(a, b) for a, b, _, _ in allreduce}):
        pts = sorted((mb, bw) for a, b, mb, bw in allreduce if (a, b) == (label, w))
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=f"{label}, {w} ranks")
    ax.set(
        xscale="log",
        xlabel="message size (MB, 2^20 bytes)",
        ylabel="bus bandwidth (GB/s, higher is better)",
        title="all-reduce bus bandwidth, 2(W-1)/W x bytes / time\n"
        + _sources(a for a, *_ in allreduce),
    )
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "allreduce_busbw.png"), dpi=110)
    plt.close(fig)
    return ["allreduce_busbw.png"]


def _plot_buckets(plt, bucket: list, out: str) -> list[str]:
    """Step time against bucket size, with the fitted model (Note [Bucket-size model])."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    fits = []
    for label in sorted({a for a, _, _ in bucket}):
        pts = sorted((mb, t) for a, mb, t in bucket if a == label)
        line = ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label)[0]
        fit = _bucket_fit(pts)
        if fit is None:
            continue
        fits.append((label, pts, fit))
        lo, hi = pts[0][0], pts[-1][0]
        grid = [lo * (hi / lo) ** (i / 60) for i in range(61)]
        best = fit.best_mb
        ax.plot(
            grid,
            [fit.predict(x) for x in grid],
            linestyle="--",
            color=line.get_color(),
            label="model c + b/w + oS/b"
            + (f", best {best:.3g} MB" if best is not None else ", no interior best"),
        )
        if best is not None and lo <= best <= hi:
            ax.plot([best], [fit.predict(best)], marker="*", ms=12, color=line.get_color())
    ax.set(
        xscale="log",
        xlabel="bucket size (MB)",
        ylabel="step time (ms, median; lower is better)",
        title="step time against bucket size\n" + _sources(a for a, *_ in bucket),
    )
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "bucket_sweep.png"), dpi=110)
    plt.close(fig)
    written = ["bucket_sweep.png"]
    if fits:
        with open(os.path.join(out, "bucket_model.md"), "w") as f:
            f.write(bucket_model_table(fits))
        written.append("bucket_model.md")
    return written


def _plot_memory(plt, memory: list, out: str) -> list[str]:
    """One memory breakdown per model, per variant."""
    written = []
    groups: dict = {}
    for label, variant, entry in memory:
        groups.setdefault(label, {})[variant] = entry
    for i, (label, by_variant) in enumerate(sorted(groups.items())):
        names = list(by_variant)
        exact = all(
            {"param_bytes", "grad_bytes", "optimizer_state_bytes", "peak_bytes"}
            <= by_variant[n].keys()
            for n in names
        )
        cuda = all("cuda" in by_variant[n] for n in names)
        if not (exact or cuda):
            continue
        fig, ax = plt.subplots(figsize=(max(6, 0.9 * len(names) + 2) + 2.5, 4.5))
        xs = range(len(names))
        if exact:
            parts = [
                ("parameters", [by_variant[n]["param_bytes"] for n in names]),
                ("gradients", [by_variant[n]["grad_bytes"] for n in names]),
                ("optimizer state", [by_variant[n]["optimizer_state_bytes"] for n in names]),
            ]
            rest = [
                by_variant[n]["peak_bytes"] - sum(p[1][j] for p in parts)
                for j, n in enumerate(names)
            ]
            parts.append(("rest at peak (activations, buffers)", [max(r, 0) for r in rest]))
            bottom = [0.0] * len(names)
            for name, vals in parts:
                mib = [v / 2**20 for v in vals]
                ax.bar(xs, mib, bottom=bottom, label=name)
                bottom = [b + m for b, m in zip(bottom, mib)]
            ax.set_ylabel("MiB per rank (exact tensor bytes, at the peak)")
        else:
            points = ("init", "before_step", "after_step")
            width = 0.8 / len(points)
            for k, point in enumerate(points):
                ax.bar(
                    [x + (k - 1) * width for x in xs],
                    [by_variant[n]["cuda"][point] / 2**30 for n in names],
                    width=width,
                    label=point.replace("_", " "),
                )
            ax.set_ylabel("GiB per GPU (torch.cuda.max_memory_allocated)")
        ax.set_xticks(list(xs), names, rotation=30, ha="right")
        ax.set_title(f"memory per variant (lower is better): {label}", fontsize=10)
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
        fig.tight_layout()
        fname = f"memory_{i}.png"
        fig.savefig(os.path.join(out, fname), dpi=110)
        plt.close(fig)
        written.append(fname)
    return written


def _write_index(out: str, written: list[str]) -> None:
    """The page that shows every plot and table written."""
    with open(os.path.join(out, "index.html"), "w") as f:
        f.write(
            "<!doctype html><meta charset='utf-8'><title>paracheck plots</title>"
            "<h1>paracheck: latest measurements</h1>\n"
            "<p>Each plot names the commit and the machine of its measurements.</p>\n"
        )
        for w in written:
            if w.endswith(".png"):
                f.write(f"<p><img src='{html.escape(w)}' alt='{html.escape(w)}'></p>\n")
            else:
                with open(os.path.join(out, w)) as table:
                    f.write(f"<h2>{html.escape(w)}</h2><pre>{html.escape(table.read())}</pre>\n")
        if not written:
            f.write(
                "<p>No measurements found: run <code>asv run</code> or <code>paracheck bench --json</code>.</p>"
            )
