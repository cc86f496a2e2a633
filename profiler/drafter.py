"""Which DSpark drafter the deployment runs: a published one for the model, a folder, the tiny drafters, or none.

`--drafter` takes `auto` (the default: the model's published drafter from profiler/catalog/drafters.yaml, the
committed tiny drafters for the tiny target, else none), `none` (train one for the tuned configuration), or a
drafter folder in the engines' layout (what `train-drafter` writes). The profile's `drafter.*` then fixes what a
checkpoint fixes (kb/match.py): its head, its depth and the longest block it can draft.
"""

from __future__ import annotations

from pathlib import Path

from profiler.catalog import published_drafter
from profiler.errors import ProfileError
from profiler.schema import AcceptProfile, DrafterProfile, HwProfile

HEAD_ORDER = ("none", "markov", "rnn")
ACCEPTANCE_FILE = "acceptance.json"  # measured acceptance beside a committed drafter (bench --record-acceptance)


def committed_drafters(root: Path) -> DrafterProfile | None:
    """The committed drafters under `root`/drafters (the tiny target's, or a fetched model's): one per head."""
    from dspark_core.drafters.dspark_layout import is_drafter, read_drafter_config

    folders = [root / "drafters" / h for h in HEAD_ORDER if is_drafter(root / "drafters" / h)]
    if not folders:
        return None
    cfgs = [read_drafter_config(f) for f in folders]
    return DrafterProfile(id=str(root / "drafters"), source=f"dspark_core/assets/{root.name}/drafters (trained here)",
                          heads=[c.head for c in cfgs], layers=cfgs[0].num_layers,
                          block_size=min(c.block_size for c in cfgs),
                          markov_rank=next((c.markov_rank for c in cfgs if c.head != "none"), cfgs[0].markov_rank),
                          confidence_head=True)  # the rank of the heads that use one (none's W1 feeds only confidence)


def measured_acceptance(root: Path, domain: str | None) -> tuple[AcceptProfile | None, list[str]]:
    """The acceptance measured for the committed drafters under `root` (`<head>/acceptance.json`, written by
    `bench --record-acceptance`) on the workload's domain, or None with a note saying why not."""
    import json

    per_head: dict[str, dict] = {}
    for h in HEAD_ORDER:
        f = root / "drafters" / h / ACCEPTANCE_FILE
        if f.is_file():
            try:
                per_head[h] = json.loads(f.read_text())
            except ValueError:
                return None, [f"{f} is not valid JSON; re-run the bench with --record-acceptance"]
    if not per_head:
        return None, []
    want = domain or "mixed"
    got = {h: d["domains"][want] for h, d in per_head.items() if want in d.get("domains", {})}
    if not got:
        have = sorted({k for d in per_head.values() for k in d.get("domains", {})})
        return None, [f"acceptance of the committed drafters is measured on {', '.join(have)}, not {want}: the "
                      "simulator uses the published prior"]
    best = max(got, key=lambda h: got[h]["tau"])  # the head the deployment runs by default: the measured best
    m = got[best]
    acc = AcceptProfile(drafter=f"{root.name}/{best}", gamma=m["gamma"], tau=m["tau"],
                        position_acceptance=m["position_acceptance"], confidence_ece=m.get("confidence_ece"),
                        source=f"measured: {m['command']}", domain=want,
                        per_head={h: g["position_acceptance"] for h, g in got.items()})
    return acc, [f"acceptance measured on {want} for heads {', '.join(got)} ({acc.source})"]


POLICY_PREFIX = {"verify_policy": "policy", "gamma_policy": "gamma"}  # <prefix>_<hw>_<dtype>_<head>.json in assets


def hw_key(hw: HwProfile) -> str | None:
    """How committed policy files name the hardware they were trained on: `cpu`, or the GPU's catalogue name."""
    if hw.arch == "cpu" or hw.vendor == "cpu":
        return "cpu"
    return hw.name.lower() if hw.name else None


def committed_policies(root: Path, hw: HwProfile, head: str | None) -> tuple[dict[str, str], list[str]]:
    """The learned policies committed beside the drafters under `root` for this hardware (`policy_<hw>_<dtype>_<head>`
    and `gamma_<hw>_<dtype>_<head>.json`, written by train-policy / train-gamma-policy), preferring `head`'s."""
    key = hw_key(hw)
    found: dict[str, str] = {}
    notes: list[str] = []
    if key is None:
        return found, notes
    for field, prefix in POLICY_PREFIX.items():
        files = sorted(root.glob(f"{prefix}_{key}_*.json"))
        if head is not None:
            files.sort(key=lambda f: not f.stem.endswith(f"_{head}"))
        if files:
            found[field] = str(files[0].resolve())
            notes.append(f"drafter.{field}: {files[0].name} (trained on {key} round logs of the "
                         f"{files[0].stem.rsplit('_', 1)[-1]} head)")
    return found, notes


def folder_drafter(path: Path) -> DrafterProfile:
    """A drafter checkpoint folder (either layout)."""
    from dspark_core.drafters.dspark_layout import read_drafter_config
    from dspark_core.errors import DSparkError

    try:
        cfg = read_drafter_config(path)
    except DSparkError as e:
        raise ProfileError(f"--drafter {path}: {e}") from None
    return DrafterProfile(id=str(path.resolve()), source=f"drafter folder {path}", heads=[cfg.head],
                          layers=cfg.num_layers, block_size=cfg.block_size, markov_rank=cfg.markov_rank,
                          confidence_head=True)


def drafter_profile(choice: str | None, model_name: str | None, committed: Path | None
                    ) -> tuple[DrafterProfile, list[str]]:
    """The drafter section for `--drafter choice` (None or "auto": what exists for this model; `committed`: the
    folder of the model's committed drafters, for the tiny target and fetched models)."""
    if choice and choice not in ("auto", "none"):
        p = Path(choice).expanduser()
        if not p.is_dir():
            raise ProfileError(f"--drafter {choice}: no such folder; give auto, none or a drafter folder "
                               "(train one with `python cli.py train-drafter`)")
        return folder_drafter(p).model_copy(update={"chosen": str(p.resolve())}), []
    if choice == "none":
        return DrafterProfile(chosen="none"), ["no drafter chosen (--drafter none): the plan searches head, depth "
                                               "and block; train the tuned one with `python cli.py train-drafter`"]
    if committed is not None:
        mine = committed_drafters(committed)
        if mine is not None:
            return mine, []
    pub = published_drafter(model_name)
    if pub is None:
        return DrafterProfile(), [f"no published DSpark drafter for {model_name or 'this model'}: the plan searches "
                                  "head, depth and block; the bundle needs DRAFT_MODEL_PATH to one trained for them"]
    return DrafterProfile(id=pub.id, source=pub.source, heads=[pub.head], layers=pub.layers,
                          block_size=pub.block_size, markov_rank=pub.markov_rank,
                          confidence_head=pub.confidence_head), [f"drafter: {pub.id} ({pub.source})"]
