"""DSpark acceptance figures on held-out code (never gates CI).

For each committed tiny drafter (dflash = head none, dspark_markov, dspark_rnn): greedy rounds at random
anchors in the target's greedy continuations of the held-out prompts (third-party code, unseen by the
tiny models), then
  - per-position conditional acceptance P(token k accepted | tokens < k accepted) (the paper's Figure 2),
  - tau(gamma) = 1 + E[min(accepted, gamma)] for every gamma up to the block (drafting gamma tokens is the
    first gamma of the trained block, so one set of rounds gives the whole curve),
  - ECE of the prefix survival before / after the drafter's STS calibration (sts.json beside it).
Writes benchmarks/results/dspark_acceptance.{json,png}.

Usage: python benchmarks/dspark_acceptance.py [--prompts benchmarks/prompts/heldout_code.jsonl]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from dspark_core.config import ASSETS
from dspark_core.drafters.dspark_layout import load_drafter
from dspark_core.modeling.checkpoint import load_model
from dspark_core.modeling.tokenizer import Tokenizer
from dspark_core.training.rounds import simulate_greedy_rounds
from dspark_core.training.train import generate_continuations
from dspark_core.verification.calibrate import StsCalibration, expected_calibration_error, survival_labels

HERE = Path(__file__).parent
NAMES = {"none": "dflash", "markov": "dspark_markov", "rnn": "dspark_rnn"}


def heldout_tokens(path: Path, tok: Tokenizer, prompt_len: int) -> torch.Tensor:
    """The last `prompt_len` tokens of every prompt long enough -> [S, prompt_len]."""
    rows = []
    for line in path.read_text().splitlines():
        ids = tok.encode(json.loads(line)["prompt"])
        if len(ids) >= prompt_len:
            rows.append(ids[-prompt_len:])
    return torch.tensor(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=Path, default=HERE / "prompts" / "heldout_code.jsonl")
    ap.add_argument("--target", type=Path, default=ASSETS / "target")
    ap.add_argument("--heads", nargs="+", default=["none", "markov", "rnn"])
    ap.add_argument("--drafters", type=Path, default=ASSETS / "drafters", help="folder with one drafter per head")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--gen-len", type=int, default=64)
    ap.add_argument("--anchors", type=int, default=24)
    ap.add_argument("--out", type=Path, default=HERE / "results" / "dspark_acceptance")
    args = ap.parse_args()

    torch.set_num_threads(2)
    target = load_model(args.target, "cpu", "fp32")
    tok = Tokenizer.load(args.target)
    prompts = heldout_tokens(args.prompts, tok, args.prompt_len)
    tokens = generate_continuations(target, prompts, args.gen_len, temperature=0.0, greedy_rows=len(prompts), seed=0)
    result: dict[str, object] = {"prompts": str(args.prompts), "sequences": len(prompts), "gen_len": args.gen_len,
                                 "anchors_per_seq": args.anchors, "drafters": {}}
    t0 = time.time()
    for head in args.heads:
        folder = args.drafters / head
        model = load_drafter(folder, target)
        rounds = simulate_greedy_rounds(model, target, tokens, args.prompt_len, anchors_per_seq=args.anchors, seed=1)
        labels = survival_labels(rounds.accepted, rounds.gamma)
        raw = torch.cumprod(torch.sigmoid(rounds.confidence_logits.double()), dim=1)
        entry = {"rounds": int(rounds.accepted.numel()), "position_acceptance": rounds.position_acceptance(),
                 "tau_by_gamma": {g: rounds.tau(g) for g in range(1, rounds.gamma + 1)},
                 "ece_raw": [expected_calibration_error(raw[:, k], labels[:, k]) for k in range(rounds.gamma)]}
        if (folder / "sts.json").is_file():
            cal = StsCalibration.load(folder / "sts.json")
            cal_surv = torch.cumprod(cal.apply(rounds.confidence_logits.double()[:, : cal.gamma]), dim=1)
            entry["ece_sts"] = [expected_calibration_error(cal_surv[:, k], labels[:, k]) for k in range(cal.gamma)]
        result["drafters"][NAMES[head]] = entry  # type: ignore[index]
    result["seconds"] = round(time.time() - t0, 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for name, e in result["drafters"].items():  # type: ignore[union-attr]
        pa = e["position_acceptance"]
        ax1.plot(range(1, len(pa) + 1), pa, marker="o", label=name)
        taus = e["tau_by_gamma"]
        ax2.plot(list(taus), list(taus.values()), marker="o", label=name)
    ax1.set(xlabel="draft position k", ylabel="P(accept k | prefix accepted)",
            title="Per-position conditional acceptance (greedy)")
    ax2.set(xlabel="block length gamma", ylabel="tau (tokens per round)", title="tau against gamma")
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(f"tiny target, {len(prompts)} held-out code prompts")
    fig.tight_layout()
    fig.savefig(args.out.with_suffix(".png"), dpi=110)
    print(json.dumps({k: {"tau@8": v["tau_by_gamma"].get(8), "tau@4": v["tau_by_gamma"].get(4)}
                      for k, v in result["drafters"].items()}, indent=2))  # type: ignore[union-attr]


if __name__ == "__main__":
    main()
