"""The report's plots say what they show: units on the axes, trials that miss an SLO apart, the exported one marked."""

from __future__ import annotations

from types import SimpleNamespace

from tuner import plots


def _capture(monkeypatch):
    plt = plots._plt()
    made = {}
    real = plt.subplots

    def subplots(*a, **k):
        fig, ax = real(*a, **k)
        made["ax"] = ax
        return fig, ax

    monkeypatch.setattr(plt, "subplots", subplots)
    monkeypatch.setattr(plt, "close", lambda fig: None)
    return made


TRIALS = [SimpleNamespace(number=i, values=[v, t]) for i, (v, t) in
          enumerate([(100.0, 9.0), (150.0, 12.0), (90.0, 30.0), (160.0, 11.0)])]


def test_pareto_marks_infeasible_and_exported(monkeypatch, tmp_path):
    made = _capture(monkeypatch)
    plots.pareto(TRIALS, {0, 3}, ["throughput (tok/s/GPU)", "p99 TPOT (ms)"], tmp_path / "p.png",
                 feasible={0, 1, 3}, exported=3)
    ax = made["ax"]
    labels = ax.get_legend_handles_labels()[1]
    assert {"Pareto front", "meets the SLOs", "misses an SLO / does not run", "exported (trial 3)"} <= set(labels)
    assert ax.get_xlabel() == "throughput (tok/s/GPU)" and ax.get_ylabel() == "p99 TPOT (ms)"
    assert (tmp_path / "p.png").is_file()


def test_history_best_so_far_counts_feasible_trials_only(monkeypatch, tmp_path):
    made = _capture(monkeypatch)
    plots.history(TRIALS, "throughput (tok/s/GPU)", tmp_path / "h.png", feasible={0, 2}, exported=0)
    ax = made["ax"]
    best = next(line for line in ax.get_lines() if line.get_label() == "best feasible so far")
    assert list(best.get_ydata()) == [100.0, 100.0]  # trials 1 and 3 miss an SLO: not "best so far"
    assert "exported (trial 0)" in ax.get_legend_handles_labels()[1]
