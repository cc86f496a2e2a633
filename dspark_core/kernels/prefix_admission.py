"""Prefix survival + global admission for the schedulers, vectorised in torch. Deliberately NOT a Triton kernel.

Decision (issue 8, item 5): a Triton kernel is not worth it here.
- Size: the input is [R, gamma] confidences, R <= a few hundred requests, gamma <= 16, so at most a few
  thousand elements. A fused kernel would save a handful of small launches (cumprod, sort, cumsum, compare,
  scatter: about 6-8 launches, a few microseconds each), i.e. tens of microseconds per round, against a
  target verify forward of milliseconds; under CUDA graphs the launch cost disappears too.
- The result must reach the host anyway: the lengths decide the shape of the verify batch the target runs
  next, so a device-to-host copy follows whatever computes them; a kernel cannot remove that sync.
- The ranking needs a global sort with a stable tie order (-a, r, j) for losslessness (see
  dspark_core/verification/schedulers.py); a single-program Triton sort of up to 4096 keys is possible but would be a
  maintenance burden for no measurable gain.
What is worth it is taking the scheduler off Python lists when R * gamma grows: these functions do the
same ranking with one stable sort and prefix sums, on whatever device the confidences live, and reproduce
dspark_core.verification.schedulers' decisions exactly (tests/kernels/test_prefix_admission.py). The GPU benchmark
(benchmarks/gpu_kernels.py) times them next to the kernels so the decision stays backed by numbers.
"""

from __future__ import annotations

import torch


def prefix_survival(conf: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
    """a[r, j] = prod_{i<=j} c[r, i] in float64; positions j >= lengths[r] get 0 (not drafted)."""
    a = conf.double().clamp(0.0, 1.0).cumprod(dim=1)  # [R, G]
    if lengths is not None:
        pos = torch.arange(conf.shape[1], device=conf.device)
        a = torch.where(pos[None] < lengths.to(conf.device)[:, None], a, torch.zeros_like(a))
    return a


def _ranked(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(sorted survivals, flat indices) in admission order: a descending, then request, then position."""
    flat = a.reshape(-1)
    order = torch.sort(-flat, stable=True).indices  # row-major flat order breaks ties by (r, j)
    return flat[order], order


def _lengths_from(order: torch.Tensor, n: torch.Tensor, rows: int, gamma: int) -> torch.Tensor:
    """Per-request verify length from the first n admitted candidates (max admitted position + 1)."""
    keep = torch.arange(order.numel(), device=order.device) < n
    r = order // gamma
    j = torch.where(keep, order % gamma + 1, torch.zeros_like(order))
    out = torch.zeros(rows, dtype=torch.int64, device=order.device)
    return out.scatter_reduce(0, r, j, reduce="amax")


def topk_admission(conf: torch.Tensor, k: int, lengths: torch.Tensor | None = None) -> torch.Tensor:
    """Global top-k candidates by survival -> verify length per request [R] (async_topk's admission)."""
    rows, gamma = conf.shape
    s, order = _ranked(prefix_survival(conf, lengths))
    n = torch.clamp((s > 0).sum(), max=max(0, int(k)))
    return _lengths_from(order, n, rows, gamma)


def prefix_admission(conf: torch.Tensor, sps_at: torch.Tensor, lengths: torch.Tensor | None = None,
                     ) -> torch.Tensor:
    """Algorithm 1 with the early stop -> verify length per request [R].

    sps_at [max_batch_tokens + 1]: target steps per second at each verify batch size (the SPS table's step
    function evaluated once at engine start); batches above its last index are never built.
    """
    rows, gamma = conf.shape
    s, order = _ranked(prefix_survival(conf, lengths))
    sps = sps_at.to(conf.device, torch.float64)
    max_batch = sps.numel() - 1
    i = torch.arange(1, s.numel() + 1, device=conf.device)
    batch = rows + i  # [M] verify batch after admitting i candidates
    tau = rows + torch.cumsum(s, dim=0)  # [M]
    theta = tau * sps[batch.clamp(max=max_batch)]
    theta0 = torch.tensor([rows * float(sps[min(rows, max_batch)])], dtype=torch.float64, device=conf.device)
    prev = torch.cat([theta0, theta[:-1]])
    improve = (theta > prev) & (s > 0) & (batch <= max_batch)
    n = improve.to(torch.int64).cumprod(dim=0).sum()
    return _lengths_from(order, n, rows, gamma)
