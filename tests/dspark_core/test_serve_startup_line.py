"""`serve` says what it will allocate before the load (a too-big bundle is visible before memory grows)."""

from __future__ import annotations

from dspark_core.cli.commands_serve import _startup_line
from dspark_core.config import EngineConfig


def test_the_startup_line_names_the_allocation(capsys):
    cfg = EngineConfig(device="cpu")
    cfg.batch.max_requests, cfg.model.max_seq_len = 300, 8192  # the tiny target's KV at 300 x 8192: ~2.4 GiB
    assert _startup_line(cfg)
    err = capsys.readouterr().err
    assert err.startswith("loading ") and "KV cache" in err and "300 requests x 8192 positions" in err
    cfg.batch.max_requests, cfg.model.max_seq_len = 3, 128  # a load of a few MiB: instant, nothing to say
    assert not _startup_line(cfg) and capsys.readouterr().err == ""
    cfg.model.path = "/no/such/model"
    assert not _startup_line(cfg)  # the load reports a bad path in its own line; nothing here
    assert capsys.readouterr().err == ""
