"""loadgen against a real `serve` process: a soak of 500+ requests at mixed concurrency and a burst, where no
request is lost, each is complete or a clean 429, and the server's metrics count what the clients got."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("fastapi")

from live.loadgen import Target, run  # noqa: E402
from live.traffic import parse_rate, plan_requests, poisson_arrivals  # noqa: E402
from profiler.errors import ProfileError  # noqa: E402
from tests.serving import ROOT, Server, scrape, serve_config  # noqa: E402


def test_soak_loses_nothing_and_metrics_match(tmp_path: Path) -> None:
    s = Server(serve_config(tmp_path, max_requests=4), "--max-waiting", "4")
    try:
        target = Target.parse(s.url, None)
        assert target.model == "target"
        records = []
        for conc, n in ((2, 120), (8, 160), (24, 160)):  # 24 clients against 4 slots + 4 queued: some get 429
            got, _ = run(target, plan_requests("code", n, 6, seed=conc), None, conc, 300.0)
            assert len(got) == n
            records += got
        burst = plan_requests("chat", 120, 4, seed=1)
        got, _ = run(target, burst, poisson_arrivals(parse_rate("40@1,400@0.2"), len(burst), 1), 0, 300.0)
        assert len(got) == len(burst)
        records += got
        assert len(records) >= 500
        bad = [r for r in records if not (r.complete or (r.status == 429 and r.retry_after))]
        assert not bad, bad[:3]
        ok = [r for r in records if r.complete]
        rejected = sum(r.status == 429 for r in records)
        assert rejected > 0 and len(ok) > 300
        m = scrape(s)
        finished = m.get(("vllm:request_success_total", "length"), 0) + m.get(("vllm:request_success_total", "stop"), 0)
        assert finished == len(ok)
        assert m[("vllm:generation_tokens_total", "")] == sum(r.completion_tokens for r in ok)
        assert m[("vllm:prompt_tokens_total", "")] == sum(r.prompt_tokens for r in ok)
        assert m[("vllm:admission_rejections_total", "max_num_queued_reqs")] == rejected
        assert m[("vllm:num_requests_running", "")] == 0 and m[("vllm:num_requests_waiting", "")] == 0
    finally:
        assert s.stop() == 0


def test_plans_and_rates() -> None:
    plan = plan_requests("code", 10, 50, seed=0)
    assert [p.index for p in plan] == list(range(10)) and all(1 <= p.max_tokens <= 50 for p in plan)
    assert plan == plan_requests("code", 10, 50, seed=0)
    assert parse_rate("2@10,12@3") == [(2.0, 10.0), (12.0, 3.0)]
    arrivals = poisson_arrivals(parse_rate("5@10,50@10"), 2000, 0)
    calm = sum(1 for t in arrivals if t % 20 < 10) / 10
    busy = sum(1 for t in arrivals if t % 20 >= 10) / 10
    assert arrivals == sorted(arrivals) and 8 < busy / calm < 12  # rates 5 and 50 per second
    for bad in ("fast", "0", "2@10,12", "-1@3"):
        with pytest.raises(ProfileError, match="--rate"):
            parse_rate(bad)


@pytest.mark.parametrize(("args", "says"), [
    (["--url", "http://127.0.0.1:9/v1", "--concurrency", "2", "--rate", "3"], "exactly one of"),
    (["--url", "http://127.0.0.1:9/v1", "--concurrency", "2"], "cannot list the models"),
    (["--url", "http://127.0.0.1:9/v1", "--rate", "soon"], "--rate"),
    (["--url", "http://127.0.0.1:9/v1", "--rate", "3", "--workload", "poetry"], "--workload"),
    (["--concurrency", "2"], "--url"),
])
def test_bad_usage_is_one_line(args: list[str], says: str) -> None:
    r = subprocess.run([sys.executable, str(ROOT / "cli.py"), "loadgen", *args], capture_output=True, text=True,
                       cwd=ROOT, timeout=60)
    assert r.returncode == 2
    assert says in r.stderr and "Traceback" not in r.stderr
