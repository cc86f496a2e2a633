"""The vectorised scheduler admission reproduces dspark_core.verification.schedulers' decisions exactly."""

from __future__ import annotations

import pytest
import torch

from dspark_core.kernels.prefix_admission import prefix_admission, prefix_survival, topk_admission
from dspark_core.verification.schedulers import as_rows, prefix_schedule, topk_lengths
from dspark_core.verification.sps import SpsTable


def _sps(max_batch: int) -> SpsTable:
    # steps/s falling with batch size, with plateaus (a step function like a profiled table)
    probes = [(b, 1000.0 / (1.0 + 0.04 * b)) for b in (1, 4, 8, 16, 32, 48, 64) if b <= max_batch]
    return SpsTable.from_probes(probes, max_batch_tokens=max_batch)


@pytest.mark.parametrize("seed", range(6))
def test_prefix_matches_python_scheduler(seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    r, g = 3 + seed, 5
    conf = torch.rand(r, g, generator=gen) ** 0.3  # mostly confident, like a trained head
    if seed % 2:
        conf[0, 1] = 1.0  # exact ties in survival
        conf[1] = conf[0]
    lengths = torch.randint(0, g + 1, (r,), generator=gen)
    sps = _sps(max_batch=r + 3 * seed + 2)  # some caps bind
    sps_at = torch.tensor([sps.lookup(b) for b in range(sps.max_batch_tokens + 1)])
    expected = prefix_schedule(as_rows(conf, lengths.tolist()), sps).lengths
    assert prefix_admission(conf, sps_at, lengths).tolist() == expected


@pytest.mark.parametrize("k", [0, 1, 5, 40])
def test_topk_matches_python_scheduler(k: int) -> None:
    gen = torch.Generator().manual_seed(k)
    conf = torch.rand(4, 6, generator=gen)
    conf[2] = conf[1]  # ties across requests break by request index
    assert topk_admission(conf, k).tolist() == topk_lengths(as_rows(conf), k)


def test_survival_masks_undrafted_positions() -> None:
    conf = torch.tensor([[0.5, 0.5, 0.5], [1.0, 0.2, 1.0]], dtype=torch.float64)
    a = prefix_survival(conf, torch.tensor([2, 3]))
    assert a.tolist() == [[0.5, 0.25, 0.0], [1.0, 0.2, 0.2]]
