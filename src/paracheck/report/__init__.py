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

from paracheck.report.history import VendorError, first_screen, serve, vendorize
from paracheck.report.plots import collect, plot_all

__all__ = ["VendorError", "collect", "first_screen", "plot_all", "serve", "vendorize"]
