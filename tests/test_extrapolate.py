"""The estimator on series with known answers: constant, noisy, warm-up, drift; overheads."""
from __future__ import annotations

import random
import statistics

import pytest

from vdkit.errors import UserError
from vdkit.validation.extrapolate import FLUCTUATION_CV, NVIDIA_WARMUP_SAMPLES, Overheads, detect_warmup, estimate
from vdkit.validation.stats import t_quantile_975


def test_constant_series_is_exact():
    e = estimate([4.0] * 50, 1000)
    assert e.warmup_steps == NVIDIA_WARMUP_SAMPLES
    assert e.step_time_mean_s == e.step_time_median_s == 4.0
    assert e.step_time_std_s == 0 and not e.fluctuating
    assert e.extrapolated and e.extrapolated_minutes == pytest.approx(1000 * 4.0 / 60)
    # Identical samples do not prove the step time never varies: the std is floored at 1 % of the
    # mean, so the interval is narrow but never zero wide.
    lo, hi = e.interval_minutes
    floor_half = t_quantile_975(44) * 0.01 * 4.0 / 45 ** 0.5 * (1000 - 5) / 60
    assert lo < e.extrapolated_minutes < hi and hi - e.extrapolated_minutes == pytest.approx(floor_half)


def test_warmup_counted_once_and_outliers_dropped():
    ts = [30.0, 12.0, 9.0, 8.0, 7.0, 6.5, 6.0] + [2.0] * 43  # 7 slow steps, the last two past NVIDIA's 5
    e = estimate(ts, 1000)
    assert e.warmup_steps == 7
    assert "2 leading outlier" in e.warmup_reason
    assert e.step_time_mean_s == 2.0
    warm = sum(ts[:7])
    assert e.warmup_seconds == pytest.approx(warm)
    assert e.extrapolated_minutes == pytest.approx((warm + (1000 - 7) * 2.0) / 60)
    assert e.steady_only_minutes == pytest.approx(1000 * 2.0 / 60)


def test_warmup_never_exceeds_half_and_short_runs_keep_half():
    assert detect_warmup([5.0, 4.0, 3.0, 2.0, 1.0, 1.0])[0] == 3  # short run: at most half
    assert detect_warmup([100.0] * 15 + [1.0] * 15)[0] == 15  # a long slow start: up to half
    assert detect_warmup([float(100 - i) for i in range(40)])[0] == 5  # a gentle trend is no warm-up


def test_noisy_series_interval_covers_truth():
    """Independent noise: the mean is close, and the 95 % interval covers the true total ~95 % of the time."""
    rng = random.Random(7)
    true_mean, target = 10.0, 1000
    covered = 0
    trials = 200
    for _ in range(trials):
        ts = [rng.gauss(true_mean, 0.5) for _ in range(50)]
        e = estimate(ts, target)
        truth = (e.warmup_seconds + (target - e.warmup_steps) * true_mean) / 60
        lo, hi = e.interval_minutes
        covered += lo <= truth <= hi
        assert not e.fluctuating  # CV 5 % is below the 10 % threshold
    assert 0.88 <= covered / trials <= 1.0


def test_noisy_statistics_match_the_standard_library():
    rng = random.Random(3)
    ts = [rng.uniform(5, 6) for _ in range(60)]
    e = estimate(ts, 100)
    steady = ts[e.warmup_steps:]
    assert e.step_time_mean_s == pytest.approx(statistics.fmean(steady))
    assert e.step_time_median_s == pytest.approx(statistics.median(steady))
    assert e.step_time_std_s == pytest.approx(statistics.stdev(steady))
    q = statistics.quantiles(steady, n=20, method="inclusive")
    assert e.step_time_p5_s == pytest.approx(q[0]) and e.step_time_p95_s == pytest.approx(q[-1])


def test_high_cv_is_fluctuating():
    rng = random.Random(11)
    e = estimate([rng.choice([6.0, 10.0]) for _ in range(50)], 1000)
    assert e.step_time_cv > FLUCTUATION_CV and e.fluctuating and "CV" in e.fluctuation_reason


def test_drift_is_flagged_and_widens_the_interval():
    ramp = [5.0 + 0.04 * i for i in range(50)]  # +40 % over the run, tiny CV within halves
    e = estimate(ramp, 1000)
    assert e.fluctuating and "drift" in e.fluctuation_reason and e.drift > 0.05
    flat = estimate([e.step_time_mean_s] * 50, 1000)
    width = e.interval_minutes[1] - e.interval_minutes[0]
    assert width > 0 and 0 < flat.interval_minutes[1] - flat.interval_minutes[0] < width / 10
    # The interval reaches at least the drift of the half means either side of the estimate.
    half_gap = (statistics.fmean(ramp[5 + 22:]) - statistics.fmean(ramp[5:5 + 22])) * (1000 - 5) / 60
    assert width >= 2 * half_gap * 0.99


def test_measured_runs_are_not_extrapolated():
    ts = [3.0] * 10 + [2.0] * 1190
    e = estimate(ts, 1000)
    assert not e.extrapolated
    assert e.extrapolated_minutes == pytest.approx((30 + 990 * 2.0) / 60)


def test_overheads_only_when_asked():
    base = estimate([2.0] * 50, 1000)
    assert "validation" in base.excludes and base.overhead_minutes == 0
    ov = Overheads(val_every_n_steps=200, val_seconds=30, checkpoint_every_n_steps=0, checkpoint_seconds=150)
    e = estimate([2.0] * 50, 1000, ov)
    assert e.overhead_minutes == pytest.approx((5 * 30 + 150) / 60)
    assert e.extrapolated_minutes == pytest.approx(base.extrapolated_minutes + (5 * 30 + 150) / 60)
    assert "validation" not in e.excludes and "checkpoint saving" not in e.excludes
    assert Overheads(checkpoint_every_n_steps=250, checkpoint_seconds=10).events(1000) == (0, 4)


def test_too_few_steps_and_bad_target_are_user_errors():
    with pytest.raises(UserError, match="too few"):
        estimate([1.0, 2.0], 1000)
    with pytest.raises(UserError, match="target"):
        estimate([1.0] * 20, 0)


@pytest.mark.parametrize("dof,expected", [(1, 12.706), (2, 4.303), (5, 2.571), (10, 2.228), (30, 2.042), (200, 1.972)])
def test_t_quantile(dof, expected):
    assert t_quantile_975(dof) == pytest.approx(expected, abs=2e-3)
