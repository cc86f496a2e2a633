"""Edge cases of the round: EOS inside a block, max_new_tokens inside a block, empty prompt, bad input."""

from __future__ import annotations

import pytest
from conftest import engine_config, random_model

from dspark_core.drafters.ar_draft import ARDrafter
from dspark_core.engine import Engine
from dspark_core.errors import DSparkError
from dspark_core.verification.sampling import SamplingParams

PROMPT = [[5, 6, 7, 8, 5, 6, 7]]


def run(block: int, sp: SamplingParams, method: str = "ar_draft"):  # noqa: ANN201 - Generation
    target = random_model(1)
    drafter = ARDrafter(target, 2, 600) if method == "ar_draft" else None  # draft == target: full blocks
    return Engine(engine_config(block=block, max_requests=2, method=method), target=target,
                  drafter=drafter).generate(PROMPT, sp)


def test_stop_token_inside_a_block_ends_the_request_there() -> None:
    free = run(8, SamplingParams(max_new_tokens=30)).outputs[0].token_ids
    stop_at = 5  # the 6th generated token becomes a stop token: it lies inside the first block of 8
    stop_tok = free[stop_at]
    first = free.index(stop_tok)
    sp = SamplingParams(max_new_tokens=30, stop_token_ids=[stop_tok])
    plain = run(8, sp, method="plain").outputs[0]
    spec = run(8, sp).outputs[0]
    assert spec.token_ids == plain.token_ids == free[:first]
    assert spec.finish_reason == plain.finish_reason == "stop"


@pytest.mark.parametrize("max_new", [1, 2, 5, 9])
def test_max_new_tokens_inside_a_block(max_new: int) -> None:
    sp = SamplingParams(max_new_tokens=max_new, ignore_eos=True)
    plain = run(8, sp, method="plain").outputs[0]
    spec = run(8, sp).outputs[0]
    assert len(spec.token_ids) == max_new
    assert spec.token_ids == plain.token_ids
    assert spec.finish_reason == "length"


def test_empty_prompt_is_an_error() -> None:
    with pytest.raises(DSparkError, match="prompt 1 is empty"):
        Engine(engine_config(method="plain"), target=random_model(1)).generate([[1, 2], []], SamplingParams())


def test_out_of_vocabulary_and_too_long_prompts_are_errors() -> None:
    eng = Engine(engine_config(method="plain"), target=random_model(1))
    with pytest.raises(DSparkError, match="outside the vocabulary"):
        eng.generate([[1, 999]], SamplingParams())
    with pytest.raises(DSparkError, match="max_seq_len"):
        eng.generate([[1] * 500], SamplingParams(max_new_tokens=64))


def test_text_prompt_without_tokenizer_is_an_error() -> None:
    eng = Engine(engine_config(method="plain"), target=random_model(1))
    with pytest.raises(DSparkError, match="tokenizer"):
        eng.generate(["hello"], SamplingParams())


def test_time_limit_cuts_the_run_and_says_so(monkeypatch) -> None:
    import dspark_core.engine as eng

    target = random_model(1)
    engine = Engine(engine_config(block=4, max_requests=1, method="plain"), target=target)
    prompts = PROMPT * 3  # one slot: the second and third wait in the queue
    sp = SamplingParams(max_new_tokens=40, ignore_eos=True)
    whole = engine.generate(prompts, sp)
    assert whole.stats.cut == 0 and all(len(o.token_ids) == 40 for o in whole.outputs)
    assert engine.generate(prompts, sp, time_limit_s=0.0).stats.cut == 3  # over before anything ran
    clock = iter(range(10_000))  # a fake clock: one second per reading
    monkeypatch.setattr(eng.time, "perf_counter", lambda: float(next(clock)))
    cut = engine.generate(prompts, sp, time_limit_s=20.0)
    assert cut.stats.cut == 3 and len(cut.outputs) == 1  # the first request was running, two never started
    out = cut.outputs[0]
    assert out.finish_reason == "time_limit" and 1 <= len(out.token_ids) < 40
