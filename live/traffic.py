"""What loadgen sends and when: requests from a workload preset or JSONL file, arrival times from a Poisson
process (optionally with rate switches, for bursts) or none (closed loop)."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from profiler.errors import ProfileError


@dataclass(frozen=True)
class Planned:
    """One request loadgen will send."""

    index: int  # order in the plan
    prompt: str
    max_tokens: int  # output tokens asked for


def plan_requests(workload: str, count: int, max_tokens: int | None, seed: int) -> list[Planned]:
    """`count` requests cycling through the workload's prompts. A preset draws output lengths from its
    lognormal (median, p99) model; a JSONL file uses each line's output_len (else the preset of its domain).
    `max_tokens` caps every request (a small model's context, a quick test)."""
    from profiler.catalog import workload_presets
    from profiler.workload import preset_profile, read_requests, request_lengths

    presets = workload_presets()
    rng = random.Random(seed)
    if workload.lower() in presets:
        wl = preset_profile(workload.lower())
        prompts: list[tuple[str, int | None]] = [(p, None) for p in presets[workload.lower()]["prompts"]]
    elif workload.endswith(".jsonl"):
        reqs = read_requests(workload)
        domains = {r.domain for r in reqs if r.domain in presets}
        wl = preset_profile(domains.pop() if len(domains) == 1 else "mixed")
        prompts = [(r.prompt, r.output_len) for r in reqs]
    else:
        raise ProfileError(f"--workload {workload!r}: use one of {', '.join(presets)} or a .jsonl file")
    _, out_model = request_lengths(wl, None)
    plan = []
    for i in range(count):
        text, n = prompts[i % len(prompts)]
        n = n or int(round(out_model.quantile(rng.gauss(0.0, 1.0))))
        plan.append(Planned(i, text, max(1, min(n, max_tokens) if max_tokens else n)))
    return plan


def parse_rate(text: str) -> list[tuple[float, float]]:
    """'4' (requests/s) or '2@10,12@3' (2/s for 10 s, then 12/s for 3 s, cycled) -> [(rate, seconds)]."""
    phases = []
    for part in text.split(","):
        rate, _, secs = part.strip().partition("@")
        try:
            r, s = float(rate), float(secs) if secs else math.inf
        except ValueError:
            raise ProfileError(f"--rate {text!r}: give requests per second, e.g. 4, or phases RATE@SECONDS, e.g. "
                               "2@10,12@3") from None
        if not (r > 0 and s > 0) or (len(text.split(",")) > 1 and math.isinf(s)):
            raise ProfileError(f"--rate {text!r}: rates and phase lengths must be positive, and every phase of a "
                               "schedule needs @SECONDS")
        phases.append((r, s))
    return phases


def poisson_arrivals(phases: list[tuple[float, float]], count: int, seed: int) -> list[float]:
    """Arrival times (seconds from the start) of `count` requests of a Poisson process whose rate follows the
    phases (cycled): exact for piecewise-constant rates (an exponential step in unit-rate time)."""
    rng = random.Random(seed + 1)
    t, out, k = 0.0, [], 0
    phase_end = phases[0][1]
    while len(out) < count:
        rate = phases[k % len(phases)][0]
        gap = rng.expovariate(1.0)  # unit-rate work left to the next arrival
        while t + gap / rate > phase_end:  # crosses into the next phase: spend the part that fits
            gap -= (phase_end - t) * rate
            t = phase_end
            k += 1
            rate = phases[k % len(phases)][0]
            phase_end = t + phases[k % len(phases)][1]
        t += gap / rate
        out.append(t)
    return out
