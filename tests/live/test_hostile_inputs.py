"""Hostile input to the live tools through the real entry points: `loadgen --url` that is not an address, a
`loadgen --workload` file that is deep, huge, a FIFO or not JSON, and `monitor` scraping pages with NaN / infinite
values (stored on SQLite and PostgreSQL, whose JSON refuses NaN), malformed buckets and absurd positions, and a
page that is not Prometheus text halfway through the watch. Each bad input is one line, exit 2, no traceback."""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

import cli
from tests.hostile_jsonl import main_within, write_hostile_jsonl, write_huge_line

NAN_PAGE = """# TYPE sglang:spec_accept_length gauge
sglang:spec_accept_length NaN
sglang:spec_accept_rate +Inf
sglang:num_running_reqs -Inf
sglang:num_queue_reqs 2
sglang:generation_tokens_total {tokens}
sglang:time_to_first_token_seconds_bucket{{le="0.1"}} NaN
sglang:time_to_first_token_seconds_bucket{{le="abc"}} 3
sglang:time_to_first_token_seconds_bucket 3
sglang:time_to_first_token_seconds_bucket{{le="+Inf"}} 4
"""
VLLM_PAGE = """vllm:num_requests_running 1
vllm:spec_decode_num_drafts_total {n}
vllm:spec_decode_num_draft_tokens_total {n4}
vllm:spec_decode_num_accepted_tokens_total {n2}
vllm:spec_decode_num_accepted_tokens_per_pos_total{{position="0"}} NaN
vllm:spec_decode_num_accepted_tokens_per_pos_total{{position="1000000000"}} 5
"""


def _vllm(n: int) -> str:
    return VLLM_PAGE.format(n=n, n2=2 * n, n4=4 * n)


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err




def _one_line_error(code: int, err: str, *says: str) -> None:
    assert code == 2 and "Traceback" not in err, err[-2000:]
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err[-2000:]
    for s in says:
        assert s in lines[0], (s, lines[0])


@pytest.mark.parametrize("url", ["not a url", "http://127.0.0.1:notaport/v1", "http://127.0.0.1:99999", "ftp://x/v1",
                                 "http://[zz]:80", "http://[::1", "http://a..b/v1", "http://host/\x00", ""])
@pytest.mark.parametrize("command", ["loadgen", "monitor"])
def test_bad_url_is_one_line(capsys: pytest.CaptureFixture[str], command: str, url: str) -> None:
    extra = ["--concurrency", "1", "--requests", "1"] if command == "loadgen" else ["--samples", "1"]
    code, _, err = _run(capsys, command, "--url", url, *extra)
    _one_line_error(code, err, "--url", "give the server's address")


@pytest.fixture(scope="module")
def huge_line(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_huge_line(tmp_path_factory.mktemp("huge"))


def test_loadgen_hostile_workloads_are_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                huge_line: Path) -> None:
    for path, says in write_hostile_jsonl(tmp_path, huge_line).values():
        code = main_within(20, ["loadgen", "--url", "http://127.0.0.1:9", "--workload", str(path),
                                 "--concurrency", "1"])
        _one_line_error(code, capsys.readouterr().err, str(path), says)


class _Pages:
    """A /metrics endpoint serving the given pages in turn (the last one again once they run out)."""

    def __init__(self, pages: list[str]) -> None:
        self.pages, self.served = pages, 0
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_a: object) -> None:
                pass

            def do_GET(self) -> None:
                body = owner.pages[min(owner.served, len(owner.pages) - 1)].encode()
                owner.served += 1
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def pages() -> Iterator[type[_Pages]]:
    made: list[_Pages] = []

    def make(p: list[str]) -> _Pages:
        made.append(_Pages(p))
        return made[-1]

    yield make  # type: ignore[misc]
    for p in made:
        p.close()


def _finite(x: object) -> bool:
    if isinstance(x, float):
        return math.isfinite(x)
    if isinstance(x, dict):
        return all(_finite(v) for v in x.values())
    if isinstance(x, list):
        return all(_finite(v) for v in x)
    return True


def test_monitor_stores_nan_pages_safely(capsys: pytest.CaptureFixture[str], db_url: str, pages) -> None:  # noqa: ANN001
    """NaN / Inf values are dropped and counted (never stored: PostgreSQL's JSON refuses NaN); a page that is not
    Prometheus text after the first scrape is skipped; the watch ends normally with its samples stored."""
    from kb.db import open_db
    from kb.deployments import deployment

    server = pages([NAN_PAGE.format(tokens=10), "<html>maintenance</html>", NAN_PAGE.format(tokens=30)])
    code, out, err = _run(capsys, "monitor", "--url", server.url, "--samples", "2", "--interval", "0.05",
                          "--db", db_url, "--json")
    assert code == 0 and "Traceback" not in err, err[-2000:]
    result = json.loads(out)
    assert result["samples"] == 2 and server.served == 3 and result["kind"] == "sglang"
    assert result["non_finite_dropped"] == 2 * 4  # 3 gauges and the NaN bucket, per sample
    assert result["window"]["output_tokens_per_s"] > 0 and "tau" not in result["window"]  # NaN gauge: unknown
    db = open_db(db_url)
    info, samples = deployment(db, result["deployment_id"])
    db.dispose()
    assert len(samples) == 2 and all(_finite(s.model_dump()) for s in samples)
    assert samples[0].accept_length is None and samples[0].ttft == {} and samples[0].non_finite == 4


def test_monitor_vllm_page_with_nan_position_and_huge_label(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                            pages) -> None:  # noqa: ANN001
    server = pages([_vllm(10), _vllm(20)])
    code, out, err = _run(capsys, "monitor", "--url", server.url + "/v1", "--samples", "2", "--interval", "0.05",
                          "--db", f"sqlite:///{tmp_path / 'kb.sqlite'}", "--json")
    assert code == 0 and "Traceback" not in err, err[-2000:]
    result = json.loads(out)
    assert result["kind"] == "vllm" and result["non_finite_dropped"] == 2  # the NaN position list, per sample
    assert result["window"]["tau"] == 3.0 and result["window"]["position_acceptance"] == []  # unknown, not shifted


def test_monitor_bundle_with_nan_predictions(capsys: pytest.CaptureFixture[str], tmp_path: Path, db_url: str,
                                             pages) -> None:  # noqa: ANN001
    """provenance.json may hold NaN and Infinity (Python's json writes them): such predictions are left out, never
    stored; a deep or non-object provenance.json is one line."""
    bundle = tmp_path / "out"
    bundle.mkdir()
    (bundle / "provenance.json").write_text('{"metrics": {"tau": NaN, "tpot_p99_ms": 12.5, "ttft_p99_ms": "x", '
                                            '"throughput": 1e999}, "predicted_acceptance": {"position_acceptance": '
                                            '[0.9, Infinity]}, "params": {"parallel.tp": 2}}')
    server = pages([_vllm(10)])
    db = db_url
    code, out, err = _run(capsys, "monitor", "--url", server.url, "--bundle", str(bundle), "--samples", "1",
                          "--db", db, "--json")
    assert code == 0 and "Traceback" not in err, err[-2000:]
    from kb.db import open_db
    from kb.deployments import deployment

    database = open_db(db)
    info, _ = deployment(database, json.loads(out)["deployment_id"])
    database.dispose()
    assert info["predictions"] == {"tpot_p99_ms": 12.5, "tp": 2}  # NaN, Infinity and text left out
    for content, says in (("[" * 10_000 + "]" * 10_000, "nested 10000 levels deep"), ("[1, 2]", "not a JSON object")):
        (bundle / "provenance.json").write_text(content)
        code, _, err = _run(capsys, "monitor", "--url", server.url, "--bundle", str(bundle), "--samples", "1",
                            "--db", db)
        _one_line_error(code, err, "--bundle", says)
