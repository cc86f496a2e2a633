"""A training state or data cache is read with torch's weights-only unpickler: a hostile `train_state.pt` /
`train_data.pt` in an output folder runs no code and is one line; the files training writes still load."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from dspark_core.errors import DSparkError
from dspark_core.training.train import TrainData, load_state


class _Payload:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):  # noqa: ANN204 - what a hostile pickle does on load
        return (os.system, (f"touch {self.marker}",))


def test_a_hostile_state_runs_no_code(tmp_path: Path) -> None:
    marker = tmp_path / "PWNED"
    state = tmp_path / "train_state.pt"
    torch.save({"step": 3, "model": _Payload(marker)}, state)
    with pytest.raises(DSparkError, match="not a training state this tool wrote") as e:
        load_state(state)
    assert "\n" not in str(e.value)
    assert not marker.exists()


def test_what_training_writes_still_loads(tmp_path: Path) -> None:
    data = TrainData(tokens=torch.zeros(2, 5, dtype=torch.long), prompt_len=2, layers=(1, 3))
    torch.save({"meta": {"seed": 0, "layers": [1, 3]}, "data": data}, tmp_path / "train_data.pt")
    got = load_state(tmp_path / "train_data.pt")
    assert got["data"].layers == (1, 3) and got["meta"]["seed"] == 0
    torch.save({"step": 7, "generator": torch.Generator().get_state(), "config": {"head": "markov"}},
               tmp_path / "train_state.pt")
    assert load_state(tmp_path / "train_state.pt")["step"] == 7
    (tmp_path / "garbage.pt").write_bytes(b"not a zip")
    with pytest.raises(DSparkError, match="garbage.pt"):
        load_state(tmp_path / "garbage.pt")
