"""Which drafter the deployment runs: a published one for the model (any method), a folder, the tiny drafters, or none.

`--drafter` takes
- `auto` (the default): the committed drafters of the tiny target / a fetched model, else the model's first published
  drafter in the order dspark > eagle3 > mtp > dflash > draft_model (profiler/catalog/drafters.yaml, AUTO_ORDER),
  else none;
- `none`: no checkpoint (the plan searches a DSpark design to train, `train-drafter`);
- a method name (`dspark`, `eagle3`, `mtp`, `dflash`, `draft_model`): the model's first published drafter of it;
  `ngram` / `suffix`: no checkpoint, proposals looked up in the text on the host;
- a catalogue drafter id (`profile --list-drafters`) of this model;
- a DSpark drafter folder in the engines' layout (what `train-drafter` writes).
A DSpark checkpoint fixes what it fixes (kb/match.py: head, depth, longest block): only then is `drafter.id` set.
`drafter.method` and the architecture fields describe any method; `drafter.available` lists what the deployment
can run. A published drafter's acceptance for the workload's domain goes to `accept.*` (published_acceptance) when
nothing was measured.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

from profiler.catalog import (
    AUTO_ORDER,
    DRAFTER_METHODS,
    HOST_METHODS,
    DrafterEntry,
    drafters,
    drafters_for,
    published_drafter,
)
from profiler.errors import ProfileError
from profiler.schema import AcceptProfile, DrafterProfile, HwProfile

ROOT = Path(__file__).resolve().parents[1]

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


def measured_method_acceptance(root: Path, domain: str | None) -> tuple[dict[str, AcceptProfile] | None, list[str]]:
    """n-gram's, suffix's and the hybrid's acceptance measured on this target (`acceptance_methods.json` beside its
    committed assets, written by `bench --record-acceptance`) on the workload's domain, by method."""
    import json

    from dspark_core.cli.acceptance_record import METHODS_FILE

    f = root / METHODS_FILE
    if not f.is_file():
        return None, []
    try:
        data = json.loads(f.read_text())
    except ValueError:
        return None, [f"{f} is not valid JSON; re-run the bench with --record-acceptance"]
    want = domain or "mixed"
    got = {}
    for method, by_domain in (data.get("methods") or {}).items():
        m = by_domain.get(want)
        if m:
            got[method] = AcceptProfile(drafter=method, gamma=m["gamma"], tau=m["tau"],
                                        position_acceptance=m["position_acceptance"],
                                        source=f"measured: {m['command']}", domain=want,
                                        method=method if method in HOST_METHODS else None)
    if not got:
        return None, []
    return got, [f"acceptance of {', '.join(sorted(got))} measured on {want} ({f.name})"]


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


def available_methods(model_name: str | None, mtp_modules: int | None = None) -> list[str]:
    """What a deployment of this model can run: its published drafters' methods (plus mtp when its config.json
    declares MTP modules: they ship inside the target checkpoint), then ngram, suffix, none."""
    got = {d.method for d in drafters_for(model_name)}
    if mtp_modules:
        got.add("mtp")
    return [m for m in AUTO_ORDER if m in got] + [*HOST_METHODS, "none"]


def config_mtp(model_name: str | None, mtp_modules: int, chosen: str | None, available: list[str]) -> DrafterProfile:
    """drafter.* of the MTP modules a config.json declares (num_nextn_predict_layers) when the catalogue lists no
    MTP drafter for the model: one target-shaped layer per module, in the target's own checkpoint."""
    return DrafterProfile(chosen=chosen, method="mtp", checkpoint=model_name, layers=1, mtp_modules=mtp_modules,
                          trained_steps=mtp_modules, available=available,
                          source=f"config.json num_nextn_predict_layers {mtp_modules} (modules in the target "
                                 "checkpoint)")


def entry_profile(d: DrafterEntry, chosen: str | None, available: list[str]) -> DrafterProfile:
    """drafter.* of a catalogue drafter; only a DSpark checkpoint sets `id` (what the bundle deploys and the plan
    takes as fixed), a DFlash one its head / block facts without them."""
    dspark = d.method == "dspark"
    block = d.method in ("dspark", "dflash")
    return DrafterProfile(
        chosen=chosen, id=d.id if dspark else None, source=d.source, heads=[d.head] if d.head else None,
        layers=d.layers, block_size=d.block_size if block else None, markov_rank=d.markov_rank if dspark else None,
        confidence_head=d.confidence_head, method=d.method, checkpoint=d.id, draft_hidden=d.hidden,
        draft_intermediate=d.intermediate, draft_vocab=d.draft_vocab, draft_model=d.draft_model,
        mtp_modules=d.mtp_modules, trained_steps=d.trained_steps, target_layers=d.target_layers, available=available)


def _choices(model_name: str | None, available: list[str]) -> str:
    ids = [d.id for d in drafters_for(model_name)]
    more = f", a catalogue id ({', '.join(ids)})" if ids else ""
    return f"auto, {', '.join(available)}{more} or a DSpark drafter folder"


def _no_method(choice: str, model_name: str | None) -> str:
    """Why `--drafter METHOD` has nothing to run for this model (MTP: its config.json declares no modules)."""
    who = model_name or "this model"
    if choice == "mtp":
        return (f"{who}'s config.json declares no MTP modules (num_nextn_predict_layers) and no published MTP "
                "drafter is catalogued for it")
    return f"no published {choice} drafter for {who}"


def drafter_profile(choice: str | None, model_name: str | None, committed: Path | None,
                    mtp_modules: int | None = None) -> tuple[DrafterProfile, list[str]]:
    """The drafter section for `--drafter choice` (None or "auto": what exists for this model; `committed`: the
    folder of the model's committed drafters, for the tiny target and fetched models; `mtp_modules`: the MTP
    modules the model's config.json declares, 0 / None: none)."""
    available = available_methods(model_name, mtp_modules)
    if choice is not None and choice.lower() in (*HOST_METHODS, *DRAFTER_METHODS):
        choice = choice.lower()
    if choice in HOST_METHODS:
        return DrafterProfile(chosen=choice, method=choice, available=available), [
            f"drafter: {choice} (proposals looked up in the prompt and output on the host; no checkpoint)"]
    if choice in DRAFTER_METHODS:
        pub = published_drafter(model_name, choice)
        if pub is None and choice == "mtp" and mtp_modules:
            return config_mtp(model_name, mtp_modules, choice, available), [
                f"drafter: mtp, the {mtp_modules} module(s) config.json declares (num_nextn_predict_layers)"]
        if pub is None:
            raise ProfileError(f"--drafter {choice}: {_no_method(choice, model_name)}; "
                               f"give {_choices(model_name, available)}")
        return entry_profile(pub, choice, available), [f"drafter: {pub.id} ({pub.method}; {pub.source})"[:300]]
    if choice and choice not in ("auto", "none"):
        by_id = next((d for d in drafters_for(model_name) if d.id.lower() == choice.lower()), None)
        if by_id is not None:
            return entry_profile(by_id, choice, available), [f"drafter: {by_id.id} ({by_id.method})"]
        p = Path(choice).expanduser()
        if not p.is_dir():
            other = next((d for d in drafters() if d.id.lower() == choice.lower()), None)
            why = (f"a drafter of {other.target}, not of {model_name}" if other is not None else
                   "no such folder or catalogue drafter")
            raise ProfileError(f"--drafter {choice}: {why}; give {_choices(model_name, available)} "
                               "(see `profile --list-drafters`)")
        prof = folder_drafter(p).model_copy(update={"chosen": str(p.resolve()), "method": "dspark",
                                                    "checkpoint": str(p.resolve()), "available": available})
        return prof, []
    if choice == "none":
        return DrafterProfile(chosen="none", available=available), [
            "no drafter chosen (--drafter none): the plan searches head, depth and block; train the tuned one with "
            "`python cli.py train-drafter`"]
    if committed is not None:
        mine = committed_drafters(committed)
        if mine is not None:
            return mine.model_copy(update={"method": "dspark", "checkpoint": mine.id, "available": available}), []
    pub = published_drafter(model_name, None)
    if pub is None and mtp_modules:
        return config_mtp(model_name, mtp_modules, None, available), [
            f"drafter: mtp, the {mtp_modules} module(s) config.json declares (no published drafter catalogued)"]
    if pub is None:
        return DrafterProfile(available=available), [
            f"no published drafter for {model_name or 'this model'}: the plan searches head, depth and block; the "
            "bundle needs DRAFT_MODEL_PATH to one trained for them (or --drafter ngram / suffix)"]
    return entry_profile(pub, None, available), [f"drafter: {pub.id} ({pub.method}; {pub.source})"[:300]]


@cache
def _priors_table(path: str) -> dict:
    import yaml

    return yaml.safe_load((ROOT / path).read_text()) or {}


DOMAIN_COLUMNS = ("math", "code", "chat", "mixed")  # acceptance_priors.yaml domain_means columns (all9 = mixed)


def published_acceptance(drafter: DrafterProfile, model_name: str | None, domain: str | None
                         ) -> tuple[AcceptProfile | None, list[str]]:
    """accept.* from the chosen catalogue drafter's published acceptance on the workload's domain (falling back to
    its `mixed` figure), or None. DSpark drafters are left to the simulator's Table 1 priors, as before."""
    if not drafter.checkpoint or drafter.method in (None, "dspark", *HOST_METHODS):
        return None, []
    entry = next((d for d in drafters_for(model_name) if d.id == drafter.checkpoint), None)
    if entry is None:
        return None, []
    want = domain or "mixed"
    if entry.acceptance_ref is not None:
        ref = entry.acceptance_ref
        row = (_priors_table(ref.file).get(ref.table) or {}).get(ref.model, {}).get(ref.method)
        if not row:
            return None, [f"acceptance of {entry.id}: {ref.file} has no {ref.table}.{ref.model}.{ref.method}"]
        col = DOMAIN_COLUMNS.index(want) if want in DOMAIN_COLUMNS else 3
        src = (f"published: DSpark paper Table 1 ({ref.model} {ref.method}, {want} mean, {ref.steps} steps, "
               f"T={ref.temperature}) via {ref.file} {ref.table}")
        return AcceptProfile(drafter=entry.id, gamma=ref.steps, tau=float(row[col]), source=src, domain=want,
                             method=entry.method), [f"accept.*: {src}"]
    rows = [a for a in entry.acceptance if a.domain == want and a.tau is not None] or \
        [a for a in entry.acceptance if a.domain == "mixed" and a.tau is not None]
    if not rows:
        return None, [f"no published acceptance of {entry.id} on {want}: the simulator uses its method prior"]
    a = rows[0]
    taus = {k: float(v) for k, v in (a.tau_at_steps or {}).items()} or None
    src = f"published ({a.reported_by}): {a.source}; {a.dataset}"
    note = "" if a.domain == want else f" ({want} not published; the {a.domain} figure)"
    return AcceptProfile(drafter=entry.id, gamma=a.steps, tau=a.tau, tau_at_gamma=taus,
                         position_acceptance=a.per_position, source=re.sub(r"\s+", " ", src)[:400],
                         domain=a.domain, method=entry.method), [f"accept.*: {entry.id} tau {a.tau} at {a.steps}{note}"]
