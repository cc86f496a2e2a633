"""build_profile: model + hardware + workload -> one Profile (what `profile` prints and `match` uses).

The model comes from, in this order: a path (.onnx file, config.json, or a Hugging Face model
folder), ``tiny`` (the project's reference target, once built), or a catalogue name (forgiving:
``qwen3`` -> Qwen3-8B with a note). Nothing heavy is imported unless the work needs it: a
catalogue model on a catalogue GPU reads YAML and a cached census only.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from dspark_core.modeling.arch import CONFIG_MAX_BYTES
from profiler.arch import ArchSpec, read_config
from profiler.catalog import resolve_model, workload_presets
from profiler.derived import context_len, derive
from profiler.errors import ProfileError
from profiler.hardware import hardware_profile
from profiler.model import (
    attn_flops_per_ctx,
    count_params,
    flops_per_token,
    kv_bytes_per_token,
    kv_state_bytes,
    prefill_flops_per_token,
    weight_bytes,
)
from profiler.schema import Flops, KvBytes, ModelProfile, Profile, WeightBytes, WorkloadProfile
from profiler.workload import (
    Traffic,
    fit_preset,
    measure_entropy,
    prompts_of,
    runnable_model,
    tokenizer_of,
    workload_profile,
)

Progress = Callable[[str], None]
TINY_NAMES = ("tiny", "tiny-target", "dspark-tiny")


def read_json(path: Path) -> dict:
    """A JSON file as a dict; a missing or broken file is one ProfileError line."""
    if not path.is_file():
        raise ProfileError(f"file not found: {path}")
    if path.stat().st_size > CONFIG_MAX_BYTES:
        raise ProfileError(f"{path}: larger than {CONFIG_MAX_BYTES} bytes, not a config.json")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ProfileError(f"{path}: invalid JSON at line {e.lineno} column {e.colno} ({e.msg})") from None
    except UnicodeDecodeError:
        raise ProfileError(f"{path}: not a text file (expected config.json)") from None
    except RecursionError:
        raise ProfileError(f"{path}: nests too deeply to be a config.json") from None
    except ValueError as e:  # a number past Python's 4300-digit limit for int parsing
        raise ProfileError(f"{path}: not a config.json ({' '.join(str(e).split())[:80]})") from None
    if not isinstance(data, dict):
        raise ProfileError(f"{path}: expected a JSON object (a config.json), got {type(data).__name__}")
    return data


def _looks_like_path(s: str) -> bool:
    return "/" in s or "\\" in s or s.endswith((".json", ".onnx")) or Path(s).exists()


def resolve_arch(model: str) -> tuple[ArchSpec | None, str, str, list[str]]:
    """(spec or None for a bare ONNX file, display name, source, notes) for any model argument."""
    notes: list[str] = []
    tiny_dir = runnable_model()
    tiny_paths = (tiny_dir.resolve(), tiny_dir.resolve() / "config.json") if tiny_dir is not None else ()
    if model.lower() in TINY_NAMES or (_looks_like_path(model) and Path(model).resolve() in tiny_paths):
        tiny = tiny_dir
        if tiny is None:
            raise ProfileError("the tiny reference model is not built yet (dspark_core/assets/tiny/target); "
                               "run `python cli.py build-tiny` first")
        return read_config(read_json(tiny / "config.json"), str(tiny)), "tiny-target", str(tiny), notes
    from dspark_core.errors import DSparkError
    from dspark_core.modeling.models_fetch import canonical, require

    if canonical(model) is not None:  # fetched through the package index: a real checkpoint folder
        try:
            folder = require(model)
        except DSparkError as e:
            raise ProfileError(str(e)) from None
        return read_config(read_json(folder / "config.json"), str(folder)), canonical(model), str(folder), notes
    if _looks_like_path(model):
        p = Path(model)
        if p.suffix == ".onnx":
            if not p.is_file():
                raise ProfileError(f"ONNX file not found: {p}")
            return None, p.stem, str(p), notes
        if p.is_dir():
            cfg = p / "config.json"
            if not cfg.is_file():
                raise ProfileError(f"{p}: no config.json in this folder (expected a Hugging Face model folder)")
            from dspark_core.modeling.weights import inside

            try:
                inside(p, cfg)  # a config.json linking out of the folder is refused, as the engine refuses it
            except DSparkError as e:
                raise ProfileError(str(e)) from None
            return read_config(read_json(cfg), str(cfg)), p.name, str(p), notes
        spec = read_config(read_json(p), str(p))
        name = p.parent.name if p.name == "config.json" and p.parent.name else p.stem
        return spec, name, str(p), notes
    entry, note = resolve_model(model)
    if note:
        notes.append(note)
    return read_config(entry.config, entry.name), entry.name, entry.source, notes


def model_profile(spec: ArchSpec, name: str, source: str, wl: WorkloadProfile) -> ModelProfile:
    """Every model.* figure, computed from the spec; FLOPs at the workload's mean lengths."""
    c = count_params(spec)
    prompt = wl.prompt_len.mean if wl.prompt_len and wl.prompt_len.mean else 1024.0
    return ModelProfile(
        name=name, family=spec.family, arch="moe" if spec.is_moe else "dense", source=source,
        params_total=float(c.total), params_active=float(c.active), num_layers=spec.num_layers,
        hidden_size=spec.hidden, intermediate_size=spec.moe_intermediate if spec.is_moe else spec.intermediate,
        num_heads=spec.num_heads, num_kv_heads=spec.num_kv_heads, head_dim=spec.head_dim, vocab_size=spec.vocab,
        attention=spec.attention, num_experts=spec.num_experts if spec.is_moe else 0,
        experts_per_token=spec.experts_per_token if spec.is_moe else 0, max_context=spec.max_context,
        tied_embeddings=spec.tied,
        weight_bytes=WeightBytes(**{d: weight_bytes(spec, d) for d in ("bf16", "fp8", "int8", "int4")}),
        kv_bytes_per_token=KvBytes(bf16=kv_bytes_per_token(spec, "bf16"), fp8=kv_bytes_per_token(spec, "fp8")),
        flops_per_token=Flops(
            prefill=round(prefill_flops_per_token(spec, prompt)),
            decode=round(flops_per_token(spec, context_len(wl) or prompt, "decode")),
            linear=float(2 * c.linear_active), attn_per_ctx=attn_flops_per_ctx(spec, "decode"),
        ),
        params_embedding=float(c.embedding), num_moe_layers=c.num_moe_layers,
        expert_params=float(c.expert) if c.num_moe_layers else None,
        shared_expert_params=float(c.shared) if c.num_moe_layers else None,
        kv_lora_rank=spec.kv_lora_rank or None, sliding_window=spec.sliding_window, dtype=spec.dtype,
        kv_state_bytes=kv_state_bytes(spec, "bf16") or None, linear_attn_layers=spec.linear_attn_layers or None,
        mtp_modules=spec.mtp_modules or None,
    )


def onnx_model_profile(path: Path) -> ModelProfile:
    """What an ONNX file alone tells: its census and its initializers' parameter count."""
    import onnx

    from profiler.census import census_onnx_file

    ops = census_onnx_file(path)
    model = onnx.load(str(path), load_external_data=False)
    total = 0
    for init in model.graph.initializer:
        n = 1
        for dim in init.dims:
            n *= dim
        total += n
    return ModelProfile(name=path.stem, source=str(path), params_total=float(total), ops=ops,
                        census_source=f"onnx file {path}")


def _carried(wl: WorkloadProfile, max_context: int | None) -> tuple[WorkloadProfile, list[str]]:
    """A workload profiled before, for a model whose context may be shorter: a preset is scaled to fit, a
    file's figures that cannot fit are an error."""
    wl = wl.model_copy(deep=True)
    if (wl.name or "").lower() in workload_presets():
        return fit_preset(wl, max_context)
    need = ((wl.prompt_len.p99 if wl.prompt_len else 0) or 0) + ((wl.output_len.p99 if wl.output_len else 0) or 0)
    if max_context and need > max_context:
        raise ProfileError(f"workload {wl.name}: p99 prompt + output ({need:.0f} tokens) exceed the model's context "
                           f"of {max_context}; profile a workload that fits this model")
    return wl, []


def build_profile(model: str | None, gpu: str | None, workload: str | WorkloadProfile | None,
                  measure: bool = True, entropy: bool | None = None, progress: Progress | None = None,
                  quality: str | None = None, gpus: int | None = None, traffic: Traffic | None = None,
                  drafter: str | None = None) -> Profile:
    """The full profile. ``workload``: a preset, a JSONL file, or an already profiled workload (kept as it
    is); ``measure``: run microbenchmarks for ``gpu='auto'``; ``entropy``: measure the target's next-token
    entropy with a runnable model (None: only together with ``gpu='auto'``); ``quality``: the workload's
    accuracy floor (standard, relaxed: 4-bit weights allowed; None keeps a profiled workload's); ``gpus``: how
    many devices the deployment has (None: not stated; the tuner then assumes one node of eight);
    ``traffic``: the user's concurrency and SLOs in place of the workload's; ``drafter``: auto (None), none or a
    drafter folder (profiler/drafter.py)."""
    if gpus is not None and gpus < 1:
        raise ProfileError(f"--gpus {gpus}: give the number of devices, at least 1")
    if quality is not None and quality not in ("standard", "relaxed"):
        raise ProfileError(f"--quality {quality!r} is not one of standard, relaxed (relaxed allows 4-bit weights "
                           "once their accuracy has been checked on the workload)")
    notes: list[str] = []
    spec: ArchSpec | None = None
    mp = ModelProfile()
    resolved = resolve_arch(model) if model else None
    tokenize = None
    ctx = resolved[0].max_context if resolved and resolved[0] is not None else None
    if isinstance(workload, WorkloadProfile):  # profiled before: its prompts may be gone, keep its entropy
        wl, wl_notes = _carried(workload, ctx)
        workload, entropy = wl.name, False if entropy is None else entropy
    else:
        if resolved and workload and workload.lower() not in workload_presets():
            tokenize = tokenizer_of(resolved[2]) if Path(resolved[2]).exists() else None
        wl, wl_notes = workload_profile(workload, tokenize, ctx)
    if quality is not None:
        wl.quality = quality  # type: ignore[assignment]  # validated above
    wl = (traffic or Traffic()).apply(wl)
    notes += wl_notes
    if resolved:
        spec, name, source, m_notes = resolved
        notes += m_notes
        if spec is None:
            mp = onnx_model_profile(Path(source))
        else:
            notes += list(spec.notes)
            mp = model_profile(spec, name, source, wl)
            from profiler.census import census

            mp.ops, mp.census_source = census(spec)
    hw = hardware_profile(gpu, measure=measure, progress=progress)
    want_entropy = entropy if entropy is not None else (measure and (gpu or "").lower() == "auto")
    if want_entropy:
        own = Path(resolved[2]) if resolved and resolved[2] else None
        # the profiled model itself when it is a runnable folder here; else the tiny reference target (noted)
        target = own if own is not None and (own / "config.json").is_file() else runnable_model()
        if target is None:
            notes.append("entropy not measured: no runnable model here (the tiny reference target "
                         "dspark_core/assets/tiny/target is not built)")
        else:
            try:
                wl.entropy = measure_entropy(target, prompts_of(workload or "chat"))
                notes.append(f"entropy measured with {target}")
            except (OSError, ValueError, RuntimeError, KeyError) as e:  # optional figure: note, don't fail
                notes.append(f"entropy not measured: {target} did not run ({type(e).__name__}: {e})"[:300])
            if progress:
                progress("entropy measured")
    profile = Profile(model=mp, workload=wl)
    if hw is not None:
        if gpus is not None and hw.arch != "cpu":
            hw.count = gpus
        profile.hw = hw
    elif gpus is not None:  # no GPU named yet: keep the count for `tune --gpu NAME`
        profile.hw.count = gpus
    if spec is not None:
        profile.derived = derive(spec, hw, wl)
    if resolved:
        from dspark_core.config import committed_assets
        from profiler.drafter import drafter_profile

        committed = committed_assets(mp.source) if mp.source else None
        profile.drafter, d_notes = drafter_profile(drafter, mp.name, committed, mp.mtp_modules)
        notes += d_notes
        if committed is None:  # a published drafter's own acceptance on this domain (committed ones are measured)
            from profiler.drafter import published_acceptance

            accept, a_notes = published_acceptance(profile.drafter, mp.name, wl.domain)
            notes += a_notes
            if accept is not None:
                profile.accept = accept
        if committed is not None and drafter in (None, "auto") and profile.drafter.id:
            from profiler.drafter import committed_policies, measured_acceptance, measured_method_acceptance

            accept, a_notes = measured_acceptance(committed, wl.domain)
            notes += a_notes
            if accept is not None:
                profile.accept = accept
            profile.accept_methods, m_notes = measured_method_acceptance(committed, wl.domain)
            notes += m_notes
            head = profile.accept.drafter.rsplit("/", 1)[-1] if profile.accept.drafter else None
            policies, p_notes = committed_policies(committed, profile.hw, head)
            profile.drafter = profile.drafter.model_copy(update=policies)
            notes += p_notes
    profile.notes = notes or None
    return profile
