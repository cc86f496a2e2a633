"""The DSpark + suffix hybrid: per request and round the draft with the larger expected accepted length; greedy fp32
outputs token-identical to plain decoding with both proposers used, and sampled outputs following the target."""

from __future__ import annotations

import time

import pytest
import torch
from conftest import engine_config, random_drafter, random_model, sampled_second_token_tv

from dspark_core.drafters.base import Drafter, DraftRequest, Proposal, RoundResult
from dspark_core.drafters.hybrid import HybridDrafter, _expected
from dspark_core.drafters.suffix import SuffixDrafter
from dspark_core.drafters.suffix_tree import expected_accepted
from dspark_core.engine import Engine
from dspark_core.verification.sampling import SamplingParams


def test_expected_accepted_length() -> None:
    conf = torch.tensor([[0.5, 0.5, 0.5], [0.9, 0.1, 1.0]])
    tokens = torch.zeros(2, 3, dtype=torch.long)
    assert _expected(Proposal(tokens, [3, 2], confidence=conf)) == pytest.approx([0.5 + 0.25 + 0.125, 0.9 + 0.09])
    assert _expected(Proposal(tokens, [0, 0], confidence=conf)) == [0.0, 0.0]
    assert _expected(Proposal(tokens, [3, 2])) == [0.0, 0.0]  # no confidences: nothing expected
    assert expected_accepted([]) == 0.0


PROMPTS = ["import os\nimport sys\n\n\ndef main(", "for i in range(10):\n    if i % 2 == 0:\n",
           "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n"]


@pytest.mark.parametrize("block", [4, 8])
def test_hybrid_greedy_is_token_identical_to_plain_and_uses_both(block: int, tiny_target, tiny_tokenizer) -> None:
    sp = SamplingParams(max_new_tokens=32, ignore_eos=False)
    plain = Engine(engine_config(method="plain"), target=tiny_target, tokenizer=tiny_tokenizer).generate(PROMPTS, sp)
    eng = Engine(engine_config(block=block, max_requests=2, method="hybrid"), target=tiny_target,
                 tokenizer=tiny_tokenizer)
    assert isinstance(eng.drafter, HybridDrafter)
    accepted = drafts = 0
    for _ in range(2):  # the second pass can also draft from the first pass's outputs
        gen = eng.generate(PROMPTS, sp)
        assert [o.token_ids for o in gen.outputs] == [o.token_ids for o in plain.outputs]
        accepted, drafts = accepted + gen.stats.accepted, drafts + gen.stats.drafts
    took = eng.drafter.proposers
    assert took["suffix"].drafts > 0 and took["dspark"].drafts > 0, took
    assert all(0 <= c.accepted <= c.verified <= c.proposed for c in took.values()), took
    assert sum(c.accepted for c in took.values()) == accepted  # every accepted token is one proposer's
    assert sum(c.drafts for c in took.values()) == drafts


def test_metrics_count_each_proposer() -> None:
    """/metrics: `dspark:spec_decode_proposer_*{proposer}` grow by what each proposer did since the last step."""
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from dspark_core.drafters.base import ProposerCount
    from dspark_core.serving.metrics import Metrics
    from dspark_core.stats import GenStats

    m = Metrics("target")
    took = {"suffix": ProposerCount(3, 20, 18, 12), "dspark": ProposerCount(1, 8, 8, 2)}
    m.engine_step(GenStats(), 1, 0, proposers=took)
    took["suffix"].drafts, took["suffix"].accepted = 5, 15
    m.engine_step(GenStats(), 1, 0, proposers=took)
    got = {(s.name, s.labels["proposer"]): s.value for fam in text_string_to_metric_families(
        generate_latest(m.registry).decode()) for s in fam.samples
        if "proposer" in s.labels and s.name.endswith("_total")}
    assert got[("dspark:spec_decode_proposer_drafts_total", "suffix")] == 5
    assert got[("dspark:spec_decode_proposer_accepted_tokens_total", "suffix")] == 15
    assert got[("dspark:spec_decode_proposer_verified_tokens_total", "dspark")] == 8
    assert got[("dspark:spec_decode_proposer_draft_tokens_total", "dspark")] == 8



def test_metrics_count_suffix_drafts_by_tree() -> None:
    """/metrics: `dspark:suffix_tree_*{tree}` grow by the verified drafts and accepted tokens of each suffix tree."""
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from dspark_core.drafters.suffix import SuffixStats, suffix_stats
    from dspark_core.serving.metrics import Metrics
    from dspark_core.stats import GenStats

    m = Metrics("target")
    st = SuffixStats(taken=[4, 1, 2], accepted=[9, 0, 1])
    m.engine_step(GenStats(), 1, 0, trees=st)
    st.taken[2], st.accepted[2] = 6, 4
    m.engine_step(GenStats(), 1, 0, trees=st)
    got = {(s.name, s.labels["tree"]): s.value for fam in text_string_to_metric_families(
        generate_latest(m.registry).decode()) for s in fam.samples if "tree" in s.labels and s.name.endswith("_total")}
    assert got[("dspark:suffix_tree_drafts_total", "corpus")] == 6
    assert got[("dspark:suffix_tree_accepted_tokens_total", "corpus")] == 4
    assert got[("dspark:suffix_tree_drafts_total", "request")] == 4
    assert got[("dspark:suffix_tree_accepted_tokens_total", "global")] == 0
    assert suffix_stats(SuffixDrafter()) is not None and suffix_stats(object()) is None


def test_hybrid_sampled_output_follows_the_target() -> None:
    target = random_model(5, vocab=6)
    drafter = HybridDrafter(random_drafter(target, block=3), SuffixDrafter(min_prob=0.0))
    tv, gen = sampled_second_token_tv(target, drafter, "hybrid", [1, 2, 3, 1, 2, 3, 1, 2], 1200)
    assert tv < 0.05
    assert drafter.proposers["suffix"].drafts > 0 and drafter.proposers["dspark"].drafts > 0, drafter.proposers
    assert gen.stats.verified > 0 and gen.stats.accepted < gen.stats.verified


class _Clock:
    """The hybrid's clock in the timing tests (`hybrid.time`): the forwards and steps advance it by their cost, so
    the test does not depend on how busy the machine is (a loaded CI core once stretched real sleeps enough to flip
    a decision)."""

    def __init__(self) -> None:
        self.t = 0.0

    def perf_counter(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.t += s


class _SlowModel(Drafter):
    """A model drafter whose forward takes `cost_s` on `clock` and whose drafts the test accepts or rejects."""

    def __init__(self, cost_s: float, clock: _Clock | None = None) -> None:
        self.cost_s, self.calls, self.clock = cost_s, 0, clock

    def reset(self, slot: int, prompt: list[int], hidden: torch.Tensor | None) -> None:
        return None

    def propose(self, requests: list[DraftRequest]) -> Proposal:
        if any(r.gamma > 0 for r in requests):
            self.calls += 1
            (self.clock or time).sleep(self.cost_s)
        g = max(r.gamma for r in requests)
        return Proposal(torch.zeros(len(requests), g, dtype=torch.long), [r.gamma for r in requests],
                        confidence=torch.full((len(requests), g), 0.9))

    def update(self, results: list[RoundResult]) -> None:
        return None


def _late_calls(model: _SlowModel, accepted: int, step_s: tuple[float, float], clock: _Clock) -> int:
    """80 rounds of one request whose text never repeats (suffix finds no match), each drafted round's first
    `accepted` tokens accepted, the target's step sleeping step_s[0] without drafts and step_s[1] with them: the
    model's calls in the last 40 rounds."""
    hybrid = HybridDrafter(model, SuffixDrafter())
    hybrid.reset(0, [1, 2, 3, 4], None)
    tokens = [1, 2, 3, 4]
    for i in range(80):
        req = DraftRequest(slot=0, tokens=tokens, gamma=4, sampling=SamplingParams(), prompt_len=4)
        p = hybrid.propose([req])
        clock.sleep(step_s[1] if p.num[0] else step_s[0])  # the target's step
        new = list(range(100 + 10 * i, 101 + 10 * i + min(accepted, p.num[0])))
        tokens = tokens + new
        hybrid.update([RoundResult(slot=0, proposed=p.num[0], verified=p.num[0], accepted=min(accepted, p.num[0]),
                                   new_tokens=new)])
        if i == 39:
            calls_first_half = model.calls
    return model.calls - calls_first_half


@pytest.mark.parametrize(("accepted", "keeps_calling"), [(0, False), (3, True)])
def test_the_model_drafts_only_while_it_pays_for_its_forward(accepted: int, keeps_calling: bool,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A model whose drafts are all rejected and whose forward costs about a round is soon left out, one whose drafts
    hold is kept (kept: all but at most one timed one-token round; left out: at most one probe, every 64 rounds)."""
    from dspark_core.drafters import hybrid as hy

    clock = _Clock()
    monkeypatch.setattr(hy, "time", clock)
    late = _late_calls(_SlowModel(0.004, clock), accepted, (0.004, 0.004), clock)
    assert (late >= 39) if keeps_calling else (late <= 1), late


@pytest.mark.parametrize(("accepted", "keeps_calling"), [(1, False), (4, True)])
def test_the_model_pays_for_the_block_step_it_causes(accepted: int, keeps_calling: bool,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Where suffix drafts nothing, DSpark's draft turns a one-token round into a block round: a cheap forward whose
    one accepted token does not pay for a block step three times as slow is left out (2 x 3 ms against 10 ms);
    four accepted tokens do pay (5 x 3 ms against 10 ms)."""
    from dspark_core.drafters import hybrid as hy

    clock = _Clock()
    monkeypatch.setattr(hy, "time", clock)
    late = _late_calls(_SlowModel(0.001, clock), accepted, (0.003, 0.009), clock)
    assert (late >= 39) if keeps_calling else (late <= 1), late


class _CountingModel(_SlowModel):
    """A model drafter that records the hidden-state rows each reset and update hands it."""

    def __init__(self) -> None:
        super().__init__(0.0)
        self.read: list[tuple[str, int, int]] = []  # (call, slot, rows)

    def reset(self, slot: int, prompt: list[int], hidden: torch.Tensor | None) -> None:
        self.read.append(("reset", slot, 0 if hidden is None else hidden.shape[0]))

    def update(self, results: list[RoundResult]) -> None:
        self.read += [("update", r.slot, r.hidden.shape[0]) for r in results if r.hidden is not None]


def test_the_model_reads_the_hidden_states_only_when_it_drafts() -> None:
    """DSpark's context is brought up to date in one read just before it drafts a slot, holding back at most
    PENDING_MAX positions; nothing is read for a finished request."""
    from dspark_core.drafters import hybrid as hy

    model = _CountingModel()
    hybrid = HybridDrafter(model, SuffixDrafter())
    hybrid.reset(0, [1, 2, 3], torch.zeros(3, 4))
    assert model.read == []  # nothing read yet
    for i in range(5):  # rounds where the model does not draft (gamma 0 asks nobody)
        req = DraftRequest(slot=0, tokens=[1, 2, 3] + list(range(i)), gamma=0, sampling=SamplingParams(),
                           prompt_len=3)
        hybrid.propose([req])
        hybrid.update([RoundResult(slot=0, proposed=0, verified=0, accepted=0, new_tokens=[7],
                                   hidden=torch.zeros(1, 4))])
    assert model.read == []
    req = DraftRequest(slot=0, tokens=list(range(8)), gamma=4, sampling=SamplingParams(), prompt_len=3)
    hybrid.cost.block_pays = lambda gain: True  # type: ignore[method-assign]  # the model's drafts pay
    hybrid.cost.plain_due = lambda: False  # type: ignore[method-assign]
    hybrid.propose([req])
    assert model.read == [("reset", 0, 3 + 5)]  # the prompt's states and five rounds', in one read
    hybrid.update([RoundResult(slot=0, proposed=4, verified=4, accepted=1, new_tokens=[7, 8],
                               hidden=torch.zeros(2, 4))])
    hybrid.propose([req])
    assert model.read[-1] == ("update", 0, 2)
    for _ in range(hy.PENDING_MAX // 50 + 1):  # long suffix runs: read once more than PENDING_MAX wait
        hybrid.update([RoundResult(slot=0, proposed=0, verified=0, accepted=0, new_tokens=[7] * 50,
                                   hidden=torch.zeros(50, 4))])
    assert model.read[-1][0] == "update" and model.read[-1][2] > hy.PENDING_MAX
    hybrid.update([RoundResult(slot=0, proposed=0, verified=0, accepted=0, new_tokens=[7], hidden=torch.zeros(1, 4),
                               finished=True)])
    hybrid.release(0)
    assert hybrid._pending == {}


def test_the_timer_keeps_block_and_one_token_rounds_apart(monkeypatch) -> None:
    """Round times are kept apart by whether the round drafted; an interval holding a prefill is dropped; a warm-up
    round is replaced by the first round ten times faster; a one-token round never prices above a block round."""
    from dspark_core.drafters import hybrid as hy

    now = [0.0]
    monkeypatch.setattr(hy.time, "perf_counter", lambda: now[0])
    t = hy._Timer()

    def round_(seconds: float, drafted: bool, model_s: float = 0.0) -> None:
        t.round_starts()
        t.drafted = drafted
        with t.model_call(model_s > 0):
            now[0] += model_s
        now[0] += seconds

    round_(3.0, False)  # a warm-up round (compilation)
    round_(0.020, True, model_s=0.005)
    round_(0.010, False)
    t.round_starts()
    assert t.round_s == pytest.approx(0.020) and t.model_s == pytest.approx(0.005)
    assert t.plain_s == pytest.approx(0.010)  # 3 s, then 10 ms: the warm-up is replaced
    assert not t.block_pays(1.0)  # 2 tokens in 25 ms against 1 in 10 ms
    assert t.block_pays(1.6) and t.share() == pytest.approx(0.25)
    t.drafted = False
    now[0] += 5.0  # a prefill ran in this interval
    t.skip()
    t.round_starts()
    assert t.plain_s == pytest.approx(0.010)
    t.plain_s = 1.0  # inflated: a one-token step is priced at most a block step
    assert t.block_pays(0.3) and not t.block_pays(0.2)  # 1.3 x 20 ms against 25 ms


def test_the_timer_leaves_a_compiling_forward_out_of_the_drafters_price(monkeypatch) -> None:
    """The drafter's first forward compiles its graphs (tens of seconds): the next ordinary forward replaces it, so
    DSpark is priced by what a round costs, not priced out of every round; a later stall (a new shape compiling)
    is left out of the mean; ordinary forwards move it by RATE."""
    from dspark_core.drafters import hybrid as hy

    now = [0.0]
    monkeypatch.setattr(hy.time, "perf_counter", lambda: now[0])
    t = hy._Timer()

    def forward(seconds: float) -> None:
        t.round_starts()
        t.drafted = True
        with t.model_call(True):
            now[0] += seconds
        now[0] += 0.020  # the block step

    forward(30.0)
    assert t.model_s == pytest.approx(30.0)
    forward(0.004)
    assert t.model_s == pytest.approx(0.004)
    forward(5.0)  # a stall: more than GAP x the mean
    assert t.model_s == pytest.approx(0.004)
    forward(0.006)
    assert t.model_s == pytest.approx(0.004 + hy._Timer.RATE * 0.002)
    t.round_starts()
    assert t.round_s == pytest.approx(0.020)  # the forwards' time is never a round's
    assert t.share() == pytest.approx(t.model_s / 0.020)


class _Proposer(Drafter):
    """Drafts `gamma` tokens of one confidence for every request (a stand-in for either proposer)."""

    def __init__(self, conf: float) -> None:
        self.conf, self.calls = conf, 0

    def reset(self, slot: int, prompt: list[int], hidden: torch.Tensor | None) -> None:
        return None

    def propose(self, requests: list[DraftRequest]) -> Proposal:
        self.calls += any(r.gamma > 0 for r in requests)
        g = max(r.gamma for r in requests)
        return Proposal(torch.zeros(len(requests), g, dtype=torch.long), [r.gamma for r in requests],
                        confidence=torch.full((len(requests), g), self.conf))

    def update(self, results: list[RoundResult]) -> None:
        return None

    def not_taken(self, slot: int) -> None:
        return None


def test_the_model_drafts_beside_suffix_only_as_often_as_its_drafts_are_taken() -> None:
    """DSpark's forward gains tokens only where its draft beats suffix's: a model whose draft loses to suffix's
    (confidence 0.05 against 0.15) sees its taken share fall, and with it the rows it drafts beside a weak suffix
    draft (gain 0.5, forward 0.15 of a round, suffix expecting ~0.18); the rounds after take suffix's as it is."""
    model, suffix = _Proposer(0.05), _Proposer(0.15)
    hybrid = HybridDrafter(model, suffix)  # type: ignore[arg-type]
    hybrid.gain = 0.5
    hybrid.cost.share = lambda: 0.15  # type: ignore[method-assign]
    e_s = [expected_accepted([0.15] * 4)]
    assert hybrid._model_rows(e_s, block=True) == [True]  # taken share 1 (the prior): 0.32 tokens beat 0.18
    req = DraftRequest(slot=0, tokens=[1, 2, 3], gamma=4, sampling=SamplingParams(), prompt_len=3)
    for _ in range(10):
        p = hybrid.propose([req])
        assert p.source == ["suffix"]
        hybrid.update([RoundResult(slot=0, proposed=4, verified=4, accepted=0, new_tokens=[5])])
    assert model.calls == 1 and hybrid.taken == 0.5  # one loss halves the share (the prior weighs one row)
    assert hybrid._model_rows(e_s, block=True) == [False]  # 0.16 tokens no longer beat 0.18: left out
