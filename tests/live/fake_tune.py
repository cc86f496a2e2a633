"""`python cli.py` with one more live engine, `fake`: each server start takes the next mode of $FAKE_ENGINE_MODES
(comma-separated ok / fail / hang / die / wrongdev; the last repeats), counted in $FAKE_ENGINE_STATE. For the fault
tests; $FAKE_TOKEN_S is the device's time per generated token."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tuner.live.engines import ENGINES, DsparkEngine, Found  # noqa: E402
from tuner.live.process import Launch  # noqa: E402

SERVER = Path(__file__).with_name("fake_server.py")


class FakeEngine(DsparkEngine):
    """Reads what the bundled engine reads; starts tests/live/fake_server.py instead."""

    name = "fake"

    def locate(self) -> Found:
        return Found("fake-engine", "1.0", sys.executable, str(Path(sys.executable).parent))

    @property
    def sps_table(self):  # noqa: ANN201 - absent: a fake server measures nothing
        """A fake server has no steps-per-second of its own: the bundle takes the simulator's table, as for an engine
        without one (LiveEvaluator.sps_table), instead of timing the tiny target's forwards per tune."""
        raise AttributeError("sps_table")

    def write(self, folder: Path, params: dict[str, Any], port: int, found: Found) -> Launch:
        modes = os.environ.get("FAKE_ENGINE_MODES", "ok").split(",")
        state = Path(os.environ["FAKE_ENGINE_STATE"])
        n = int(state.read_text()) if state.exists() else 0
        state.write_text(str(n + 1))
        mode = modes[min(n, len(modes) - 1)]
        (folder / "params.txt").write_text(repr(sorted(params.items())))
        argv = [sys.executable, str(SERVER), str(port), "ok" if mode == "wrongdev" else mode]
        if mode == "wrongdev":  # a launch script that sets its own visible devices (another group's)
            argv = ["env", "CUDA_VISIBLE_DEVICES=99", *argv]
        return Launch(argv, {}, folder, port,
                      identity=f"start {n}")  # every start a new server: each takes the next mode


ENGINES["fake"] = FakeEngine
os.environ["DSPARK_ENGINE_PLUGINS"] = "tests.live.fake_tune"  # the tuner's worker processes register it too

if __name__ == "__main__":
    from cli import main

    sys.exit(main())
