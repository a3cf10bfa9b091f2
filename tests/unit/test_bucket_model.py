"""The bucket-size model (Note [Bucket-size model]): fitted to a sweep, it recovers the
coefficients that made it and puts the best bucket at sqrt(o S w); the report draws it."""

import math

import pytest

from paracheck.bench.bucket_model import fit_bucket_model
from paracheck.report.plots import bucket_model_table, plot_all

SIZES = (1, 2.5, 5, 10, 25, 50, 100, 250, 1000)


def _sweep(c=60.0, per_mb=0.02, overhead=40.0, noise=()):
    return [
        (b, c + per_mb * b + overhead / b + (noise[i] if noise else 0.0))
        for i, b in enumerate(SIZES)
    ]


def test_fit_recovers_the_coefficients_and_the_best_bucket():
    fit = fit_bucket_model(_sweep())
    assert fit.c_ms == pytest.approx(60.0, rel=1e-9)
    assert fit.per_mb_ms == pytest.approx(0.02, rel=1e-9)
    assert fit.overhead_ms_mb == pytest.approx(40.0, rel=1e-9)
    assert fit.best_mb == pytest.approx(math.sqrt(40.0 / 0.02), rel=1e-9)
    assert fit.rms_ms < 1e-9 and fit.n == len(SIZES)
    # The predicted best is the model's minimum: no size of a fine grid does better.
    grid = [0.5 * 1.01**k for k in range(800)]
    assert min(fit.predict(x) for x in grid) >= fit.predict(fit.best_mb) - 1e-12


def test_fit_with_noise_keeps_the_best_bucket_near():
    """Noise of +-0.5 ms on a 60 ms step moves the predicted best by less than a factor 1.5."""
    noise = (0.5, -0.5, 0.3, -0.2, 0.5, -0.5, 0.1, -0.4, 0.2)
    fit = fit_bucket_model(_sweep(noise=noise))
    assert 1 / 1.5 < fit.best_mb / math.sqrt(40.0 / 0.02) < 1.5
    assert 0 < fit.rms_ms < 0.5


def test_a_sweep_without_an_interior_optimum_predicts_none():
    """Step time falling all the way to the largest bucket: no exposed-tail term, no best."""
    fit = fit_bucket_model([(b, 50.0 + 40.0 / b) for b in SIZES])
    assert fit.per_mb_ms <= 1e-9
    flat_tail = fit_bucket_model([(b, 50.0 + 40.0 / b - 1e-6 * b) for b in SIZES])
    assert flat_tail.best_mb is None


@pytest.mark.parametrize(
    "points, match",
    [
        ([(1, 5.0), (2, 4.0)], "three distinct bucket sizes"),
        ([(1, 5.0), (1, 5.1), (2, 4.0), (2, 4.2)], "three distinct bucket sizes"),
        ([(0, 5.0), (1, 4.0), (2, 3.0)], "must be > 0 MB"),
    ],
)
def test_too_few_or_bad_points_are_named(points, match):
    with pytest.raises(ValueError, match=match):
        fit_bucket_model(points)


def test_report_draws_the_model_and_writes_its_table(tmp_path):
    pytest.importorskip("matplotlib")
    label = "bucketed, xl LM, commit 0123456789 on test"
    data = {
        "allreduce": [],
        "memory": [],
        "bucket": [(label, b, t) for b, t in _sweep()]
        + [("two sizes", 1, 3.0), ("two sizes", 2, 2.0)],
    }
    written = plot_all(data, str(tmp_path))
    assert "bucket_sweep.png" in written and "bucket_model.md" in written
    table = (tmp_path / "bucket_model.md").read_text()
    assert label in table and "two sizes" not in table  # two sizes: no fit
    row = next(line for line in table.splitlines() if line.startswith(f"| {label}"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert float(cells[5]) == pytest.approx(math.sqrt(40.0 / 0.02), rel=1e-2)
    assert float(cells[6]) == 50  # the measured best of the sweep
    assert "bucket_model.md" in (tmp_path / "index.html").read_text()
    assert bucket_model_table([]).count("\n") == 2
