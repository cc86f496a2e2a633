"""The online step API: requests that arrive while others run, aborts, per-request sampling, one loop with
`generate`."""

from __future__ import annotations

import pytest
from conftest import engine_config

from dspark_core.drafters.ar_draft import ARDrafter
from dspark_core.engine import Engine
from dspark_core.errors import DSparkError
from dspark_core.verification.sampling import SamplingParams

PROMPTS = ["import os\nimport sys\n\n\ndef main(", "for i in range(10):\n    if i % 2 == 0:\n", "x",
           "class Stack:\n    def push(self, item):\n", '"""Utilities for parsing.\n\nThis module']
SP = SamplingParams(max_new_tokens=16)


def _engine(tiny_target, tiny_tokenizer, tiny_draft=None, max_requests: int = 2) -> Engine:
    cfg = engine_config(block=4, max_requests=max_requests, method="ar_draft" if tiny_draft else "plain")
    drafter = ARDrafter(tiny_draft, max_requests, 600) if tiny_draft is not None else None
    return Engine(cfg, target=tiny_target, tokenizer=tiny_tokenizer, drafter=drafter)


@pytest.fixture(scope="module")
def plain(tiny_target, tiny_tokenizer) -> list[list[int]]:
    return [o.token_ids for o in _engine(tiny_target, tiny_tokenizer).generate(PROMPTS, SP).outputs]


def _run(eng: Engine, arrivals: dict[int, list[int]]) -> dict[str, list[int]]:
    """Step the engine, adding PROMPTS[i] for i in arrivals[step] at that step; returns tokens per request id,
    checking the streamed updates add up to each output."""
    streamed: dict[str, list[int]] = {}
    done: dict[str, list[int]] = {}
    step = 0
    while eng.has_work() or any(s >= step for s in arrivals):
        for i in arrivals.get(step, []):
            eng.add_request(PROMPTS[i], SP, request_id=f"p{i}")
        for u in eng.step():
            streamed.setdefault(u.request_id, []).extend(u.new_tokens)
            if u.output is not None:
                done[u.request_id] = u.output.token_ids
        step += 1
    assert streamed == done
    return done


def test_late_arrivals_decode_as_alone(plain, tiny_target, tiny_draft, tiny_tokenizer) -> None:
    """Greedy requests joining a running batch at any step get the tokens they get alone (plain and draft)."""
    arrivals = {0: [0], 1: [1, 2], 5: [3], 6: [4]}
    for draft in (None, tiny_draft):
        eng = _engine(tiny_target, tiny_tokenizer, draft)
        done = _run(eng, arrivals)
        assert [done[f"p{i}"] for i in range(len(PROMPTS))] == plain
        assert eng.num_running == eng.num_waiting == 0
        assert sorted(eng._free) == [0, 1]  # every slot back


def test_abort_frees_the_slot(plain, tiny_target, tiny_draft, tiny_tokenizer) -> None:
    eng = _engine(tiny_target, tiny_tokenizer, tiny_draft, max_requests=1)
    eng.add_request(PROMPTS[0], SP, request_id="a")
    eng.add_request(PROMPTS[1], SP, request_id="b")  # waits: one slot
    eng.step()
    assert (eng.num_running, eng.num_waiting) == (1, 1)
    out = eng.abort("a")
    assert out is not None and out.finish_reason == "abort" and out.request_id == "a"
    assert eng.abort("a") is None  # no longer live
    done = {}
    while eng.has_work():
        done |= {u.request_id: u.output for u in eng.step() if u.output}
    assert done["b"].token_ids == plain[1]
    aborted_waiting = eng.add_request(PROMPTS[2], SP)
    assert eng.abort(aborted_waiting).token_ids == []


def test_mixed_sampling_in_one_batch(plain, tiny_target, tiny_draft, tiny_tokenizer) -> None:
    """A greedy request batched with sampled ones still decodes greedily; the sampled ones are reproducible."""
    hot = SamplingParams(max_new_tokens=16, temperature=1.0, seed=7)
    runs = []
    for _ in range(2):
        eng = _engine(tiny_target, tiny_tokenizer, tiny_draft, max_requests=3)
        eng.add_request(PROMPTS[1], hot, request_id="s1")
        eng.add_request(PROMPTS[0], SP, request_id="g")
        eng.add_request(PROMPTS[3], hot.model_copy(update={"seed": 8}), request_id="s2")
        done = {}
        while eng.has_work():
            done |= {u.request_id: u.output.token_ids for u in eng.step() if u.output}
        runs.append(done)
    assert runs[0]["g"] == plain[0]
    assert runs[0] == runs[1]


def test_bad_requests(tiny_target, tiny_tokenizer) -> None:
    eng = _engine(tiny_target, tiny_tokenizer)
    eng.add_request("x", SP, request_id="dup")
    with pytest.raises(DSparkError, match="already live"):
        eng.add_request("y", SP, request_id="dup")
    with pytest.raises(DSparkError, match="request r is empty"):
        eng.add_request([], SP, request_id="r")
    with pytest.raises(DSparkError, match="max_seq_len"):
        eng.add_request("x", SamplingParams(max_new_tokens=10_000))
    with pytest.raises(DSparkError, match="idle engine"):
        eng.generate(["x"], SP)
    assert eng.num_waiting == 1  # the bad ones left nothing behind


def test_generate_leaves_nothing_behind_on_a_bad_prompt(tiny_target, tiny_tokenizer) -> None:
    eng = _engine(tiny_target, tiny_tokenizer)
    with pytest.raises(DSparkError, match="prompt 1 is empty"):
        eng.generate(["x", []], SP)
    assert not eng.has_work()
    assert len(eng.generate(["x"], SP).outputs) == 1


def test_admission_cap_limits_the_running_batch(plain, tiny_target, tiny_draft, tiny_tokenizer) -> None:
    eng = _engine(tiny_target, tiny_tokenizer, tiny_draft, max_requests=3)
    eng.admit_cap = 1
    for i in range(3):
        eng.add_request(PROMPTS[i], SP, request_id=f"p{i}")
    done, most = {}, 0
    while eng.has_work():
        done |= {u.request_id: u.output.token_ids for u in eng.step() if u.output}
        most = max(most, eng.num_running)
    assert most == 1 and [done[f"p{i}"] for i in range(3)] == plain[:3]
