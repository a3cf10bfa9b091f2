"""``paracheck report``: asv's history pages, made to work offline, plus plots of the latest
measurements, each naming the commit and the machine it was measured on.

1. ``asv publish`` (unless ``--no-publish``) writes the pages to the configuration's ``html_dir``.
2. asv's ``index.html`` loads jQuery, flot, bootstrap, md5 and stupidtable from CDNs; a machine
   without network (or a CI artifact opened later) shows an error banner and no graph. Every
   such reference is replaced by a copy under ``<html_dir>/vendor/``, taken from the npm packages
   listed in ``_www/MANIFEST.json`` (re-created and verified by ``scripts/vendor_asv_js.sh``).
   A CDN reference not in the manifest (a newer asv) is an error, not a silent half-offline page.
3. Plots (matplotlib, PNG) of the latest measurements: all-reduce bus bandwidth against size, step
   time against bucket size, and memory per variant (exact breakdown into parameters, gradients,
   optimizer state and the rest where available, CUDA peaks otherwise). Data comes from the
   newest asv result file of each machine and from ``--from-json`` files written by
   ``paracheck bench --json`` or ``scripts/gpu_bench.py``. Written to ``--out``
   (default ``<html_dir>/paracheck``) with an ``index.html``.
4. ``--serve`` serves the pages on 127.0.0.1 until interrupted. asv's pages fetch their data
   (``index.json``, ``graphs/...``) with XMLHttpRequest, which browsers refuse for ``file://``
   pages: opened as a file, the history page stays an empty grey page.

asv 0.6 lists as regressions the commits where a benchmark's value went *up*: every benchmark of
``benchmarks/`` is therefore recorded in a lower-is-better form (seconds per GB rather than GB/s,
a time ratio rather than a speed-up) and says so in its unit.
"""

from __future__ import annotations

import argparse
import functools
import glob
import html
import http.server
import itertools
import json
import os
import re
import shutil
import subprocess
import sys

__all__ = ["main", "vendorize", "VendorError", "collect", "plot_all"]

_WWW = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_www")
_EXTERNAL = re.compile(
    r'<(script|link)\b[^>]*?\b(src|href)="(https?://[^"]+)"[^>]*>', re.IGNORECASE
)


class VendorError(RuntimeError):
    """asv's pages reference something from the network that paracheck does not vendor."""


def _manifest() -> dict:
    if not os.path.exists(os.path.join(_WWW, "MANIFEST.json")):
        raise VendorError(
            f"{_WWW}/MANIFEST.json is missing: paracheck was installed without its package data "
            f'(pyproject: [tool.setuptools.package-data] "paracheck.bench" = ["_www/*"])'
        )
    with open(os.path.join(_WWW, "MANIFEST.json")) as f:
        return {e["url"]: e for e in json.load(f)["files"]}


def vendorize(html_dir: str) -> list[str]:
    """Rewrite every ``.html`` file under ``html_dir`` to load its scripts and styles from
    ``vendor/`` (copied there); returns the URLs replaced. Raises VendorError for a URL of a
    ``<script src>`` or ``<link href>`` that the manifest does not know."""
    manifest = _manifest()
    vendor = os.path.join(html_dir, "vendor")
    os.makedirs(vendor, exist_ok=True)
    replaced: list[str] = []
    for page in glob.glob(os.path.join(html_dir, "**", "*.html"), recursive=True):
        with open(page, encoding="utf-8") as f:
            text = f.read()
        prefix = os.path.relpath(vendor, os.path.dirname(page)).replace(os.sep, "/")

        def local(match):
            tag, url = match.group(0), match.group(3)
            if match.group(1).lower() == "link" and "stylesheet" not in tag.lower():
                return tag  # a plain hyperlink-like <link>, nothing is loaded from it
            if url not in manifest:
                raise VendorError(
                    f"{os.path.relpath(page, html_dir)} loads {url}, which paracheck does not vendor "
                    f"(a newer asv?): add it to {_WWW}/MANIFEST.json and run scripts/vendor_asv_js.sh"
                )
            entry = manifest[url]
            shutil.copyfile(os.path.join(_WWW, entry["file"]), os.path.join(vendor, entry["file"]))
            replaced.append(url)
            # The page's integrity hash is the CDN file's; a local copy may be the npm package's
            # unminified build of the same version, so the attribute goes, with crossorigin.
            tag = tag.replace(url, f"{prefix}/{entry['file']}")
            tag = re.sub(r'\s(integrity|crossorigin|referrerpolicy)="[^"]*"', "", tag)
            return tag

        new = _EXTERNAL.sub(local, text)
        if new != text:
            with open(page, "w", encoding="utf-8") as f:
                f.write(new)
    shutil.copyfile(os.path.join(_WWW, "LICENSES.txt"), os.path.join(vendor, "LICENSES.txt"))
    return replaced


# -- data ---------------------------------------------------------------------------------------
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


def collect(results_dir: str | None, json_files) -> dict:
    """Series for the plots: ``allreduce`` [(label, W, MB, busbw GB/s)], ``bucket``
    [(label, MB, step ms)], ``memory`` [(label, variant, dict)]; every label ends with
    ``_where``'s commit and machine."""
    data = {"allreduce": [], "bucket": [], "memory": []}
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
        mem = {}
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


def plot_all(data: dict, out: str) -> list[str]:
    """Write the PNGs for whatever ``data`` holds; returns their file names."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(out, exist_ok=True)
    written = []
    if data["allreduce"]:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for label, w in sorted({(a, b) for a, b, _, _ in data["allreduce"]}):
            pts = sorted((mb, bw) for a, b, mb, bw in data["allreduce"] if (a, b) == (label, w))
            ax.plot(
                [p[0] for p in pts], [p[1] for p in pts], marker="o", label=f"{label}, {w} ranks"
            )
        ax.set(
            xscale="log",
            xlabel="message size (MB, 2^20 bytes)",
            ylabel="bus bandwidth (GB/s, higher is better)",
            title="all-reduce bus bandwidth, 2(W-1)/W x bytes / time\n"
            + _sources(a for a, *_ in data["allreduce"]),
        )
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(os.path.join(out, "allreduce_busbw.png"), dpi=110)
        plt.close(fig)
        written.append("allreduce_busbw.png")
    if data["bucket"]:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for label in sorted({a for a, _, _ in data["bucket"]}):
            pts = sorted((mb, t) for a, mb, t in data["bucket"] if a == label)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label)
        ax.set(
            xscale="log",
            xlabel="bucket size (MB)",
            ylabel="step time (ms, median; lower is better)",
            title="step time against bucket size\n" + _sources(a for a, *_ in data["bucket"]),
        )
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(os.path.join(out, "bucket_sweep.png"), dpi=110)
        plt.close(fig)
        written.append("bucket_sweep.png")
    groups = {}
    for label, variant, entry in data["memory"]:
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
    with open(os.path.join(out, "index.html"), "w") as f:
        f.write(
            "<!doctype html><meta charset='utf-8'><title>paracheck plots</title>"
            "<h1>paracheck: latest measurements</h1>\n"
            "<p>Each plot names the commit and the machine of its measurements.</p>\n"
        )
        for w in written:
            f.write(f"<p><img src='{html.escape(w)}' alt='{html.escape(w)}'></p>\n")
        if not written:
            f.write(
                "<p>No measurements found: run <code>asv run</code> or <code>paracheck bench --json</code>.</p>"
            )
    return written


def _load_conf(path: str) -> dict:
    from asv.util import load_json

    return load_json(path, js_comments=True)


def main(argv=None) -> int:
    """``paracheck report``: 0 when the pages and plots are written, 1 when asv publish or the
    vendoring fails, 2 on a usage error."""
    p = argparse.ArgumentParser(prog="paracheck report", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--config", default="asv.conf.json", help="asv configuration (default ./asv.conf.json)"
    )
    p.add_argument(
        "--html-dir",
        default=None,
        help="override the configuration's html_dir (default: its html_dir)",
    )
    p.add_argument("--out", default=None, help="where the plots go (default <html_dir>/paracheck)")
    p.add_argument(
        "--from-json",
        action="append",
        default=[],
        help="a paracheck bench --json file (repeatable; default: none)",
    )
    p.add_argument(
        "--no-publish",
        action="store_true",
        help="do not run asv publish (vendor and plot only; default off)",
    )
    p.add_argument(
        "--serve",
        action="store_true",
        help="then serve the pages on 127.0.0.1 and print their URL until Ctrl-C (default off); opened "
        "as files the history pages stay blank: browsers refuse their data requests on file://",
    )
    p.add_argument(
        "--port", type=int, default=8080, help="port of --serve; 0 picks a free one (default 8080)"
    )
    args = p.parse_args(argv)
    if not 0 <= args.port <= 65535:
        print(f"paracheck report: --port={args.port} must be in 0..65535", file=sys.stderr)
        return 2
    if not os.path.exists(args.config):
        print(f"paracheck report: --config={args.config!r} does not exist", file=sys.stderr)
        return 2
    for path in args.from_json:
        if not os.path.exists(path):
            print(f"paracheck report: --from-json={path!r} does not exist", file=sys.stderr)
            return 2
    conf = _load_conf(args.config)
    base = os.path.dirname(os.path.abspath(args.config))
    html_dir = os.path.join(base, args.html_dir or conf.get("html_dir", "html"))
    results_dir = os.path.join(base, conf.get("results_dir", "results"))
    if not args.no_publish:
        cmd = [sys.executable, "-m", "asv", "publish", "--config", os.path.abspath(args.config)]
        if args.html_dir:
            cmd += ["--html-dir", html_dir]
        proc = subprocess.run(cmd, cwd=base, capture_output=True, text=True)
        if proc.returncode != 0:
            print(
                f"paracheck report: asv publish failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}",
                file=sys.stderr,
            )
            return 1
    if os.path.exists(os.path.join(html_dir, "index.html")):
        try:
            replaced = vendorize(html_dir)
        except VendorError as exc:
            print(f"paracheck report: {exc}", file=sys.stderr)
            return 1
        print(
            f"history pages: {html_dir}/index.html ({len(set(replaced))} CDN references served from vendor/); "
            f"view them with `paracheck report --no-publish --serve` (or any static HTTP server): opened as a "
            f"file the page stays blank, as browsers refuse its data requests on file:// URLs"
        )
    else:
        print(f"history pages: none in {html_dir} (run asv publish, or drop --no-publish)")
    out = args.out or os.path.join(html_dir, "paracheck")
    written = plot_all(collect(results_dir, args.from_json), out)
    print(f"plots: {', '.join(written) or 'none (no measurements)'} in {out}")
    if args.serve:
        return serve(html_dir, args.port, plots=os.path.relpath(out, html_dir))
    return 0


def serve(directory: str, port: int = 0, *, plots: str | None = None, ready=None) -> int:
    """Serve ``directory`` on 127.0.0.1:``port`` (0: a free port) until interrupted, after
    printing the URL; ``ready(server)`` is called once listening (tests stop it with
    ``server.shutdown()``). 0 when stopped, 2 when the port cannot be bound."""

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, fmt, *args):  # one line per request would drown the URL
            pass

    try:
        server = http.server.ThreadingHTTPServer(
            ("127.0.0.1", port), functools.partial(Quiet, directory=directory)
        )
    except OSError as exc:
        print(f"paracheck report: --port={port} cannot be used: {exc}", file=sys.stderr)
        return 2
    url = f"http://127.0.0.1:{server.server_address[1]}/"
    print(
        f"serving {directory} at {url} (history pages)"
        + (f", plots at {url}{plots}/" if plots and not plots.startswith("..") else "")
        + "; Ctrl-C stops",
        flush=True,
    )
    if ready is not None:
        ready(server)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0
