"""The DSpark drafter checkpoint layout the released engines load (SGLang 0.5.23 and vLLM 0.33), both ways.

One folder serves both engines and ours: `config.json` + `model.safetensors`.
* config.json: `architectures: ["Qwen3DSparkModel"]` and `model_type: "qwen3"` (SGLang reads the config through
  transformers' AutoConfig and refuses an unknown model_type; vLLM rewrites any other DSpark architecture to
  DeepSeek-V4's, which is why a Llama-type draft config does not work there: the draft's own layers are Qwen3-style
  whatever the target). Backbone fields as a Qwen3 config; `block_size` (gamma), `markov_rank`, `markov_head_type`,
  `enable_confidence_head`, `confidence_head_with_markov` and `sample_from_anchor` at the top level (SGLang's model
  builder and vLLM's defaults read them only there; vLLM refuses `sample_from_anchor` inside `dflash_config`);
  `dflash_config` with `block_size`, `target_layer_ids` (HF numbering: the output of target layer k),
  `num_target_layers` and `mask_token_id`. Our own settings (the head kind, training provenance) sit under
  `dspark_tune`, which both engines ignore.
* Tensors, without a `model.` prefix (vLLM adds its own and refuses a second), without the embedding and LM head
  (both engines share the target's): `layers.i.self_attn.{q,k,v,o}_proj`, `.{q,k}_norm`, `layers.i.mlp.{gate,up,down}
  _proj`, `layers.i.{input,post_attention}_layernorm`, `norm`, `fc` (the target-state projection), `hidden_norm`,
  `markov_head.markov_w1` / `markov_w2` ([V, r] each), `markov_head.joint_proj` (RNN head: [3r, 2r + H] + bias, rows
  gate / candidate / output, input [state; W1[x]; h]) and `confidence_head.proj` ([1, H + r] + bias).
The formulas behind those names are ours exactly (dspark_core/drafters/heads.py; SGLang models/dspark.py
`VanillaMarkov`, `RNNHead`, `DSparkConfidenceHead`). Head `none` (the DFlash-style ablation) has no Markov bias;
both engines require markov_rank > 0 for DSpark, so it ships as a vanilla head with W2 = 0, which adds exactly
nothing. The drafter's files (save / load / inspect, either layout) live here too.
Sources (file and line in each release): docs/drafters.md; checked by benchmarks/interop_check.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from dspark_core.atomic import atomic_write
from dspark_core.drafters.draft_schema import check_engine_file, check_legacy_file
from dspark_core.drafters.dspark import DraftConfig, DSparkDraftModel
from dspark_core.errors import DSparkError

if TYPE_CHECKING:
    from dspark_core.modeling.model import LeanModel

ENGINE_CONFIG = "config.json"  # drafter architecture in the engines' layout
CONFIG_FILE = "dspark_config.json"  # the older layout's architecture file (still loaded)
WEIGHTS_FILE = "model.safetensors"  # drafter weights (without the shared embedding / LM head)

ARCHITECTURE = "Qwen3DSparkModel"  # the one DSpark architecture both engines map to their dense Qwen3-style draft
HEAD_TYPES = {"none": "vanilla", "markov": "vanilla", "rnn": "rnn"}  # our head -> markov_head_type


def engine_config(cfg: DraftConfig, num_target_layers: int, max_position_embeddings: int,
                  dtype: torch.dtype = torch.bfloat16) -> dict[str, Any]:
    """config.json of a drafter in the engines' layout."""
    if cfg.mask_token_id is None:
        raise DSparkError("this drafter learned its own mask vector, which the engines cannot load (they embed a mask "
                          "token id); retrain it with `python cli.py train-drafter` to export it")
    return {
        "architectures": [ARCHITECTURE], "model_type": "qwen3",
        "hidden_size": cfg.hidden_size, "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_layers, "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads, "head_dim": cfg.head_dim, "vocab_size": cfg.vocab_size,
        "rms_norm_eps": cfg.rms_norm_eps, "rope_theta": cfg.rope_theta, "hidden_act": "silu",
        "attention_bias": False, "tie_word_embeddings": False, "max_position_embeddings": max_position_embeddings,
        "torch_dtype": str(dtype).removeprefix("torch."),
        "block_size": cfg.block_size,
        "dflash_config": {"block_size": cfg.block_size, "target_layer_ids": list(cfg.target_layers),
                          "num_target_layers": num_target_layers, "mask_token_id": cfg.mask_token_id},
        "markov_rank": cfg.markov_rank, "markov_head_type": HEAD_TYPES[cfg.head],
        "enable_confidence_head": True, "confidence_head_with_markov": True, "sample_from_anchor": True,
        "dspark_tune": {"head": cfg.head, "extra": cfg.extra},
    }


def engine_tensors(model: DSparkDraftModel) -> dict[str, torch.Tensor]:
    """The drafter's weights under the engines' names (fused q/kv and gate/up split again)."""
    c = model.cfg
    kvw = c.num_kv_heads * c.head_dim
    out: dict[str, torch.Tensor] = {"fc.weight": model.ctx_proj.weight, "hidden_norm.weight": model.ctx_norm.weight,
                                    "norm.weight": model.norm.weight}
    for i, layer in enumerate(model.layers):
        p = f"layers.{i}."
        k, v = layer.kv.weight.split([kvw, kvw])
        gate, up = layer.gate_up.weight.chunk(2)
        out |= {p + "input_layernorm.weight": layer.input_norm.weight,
                p + "post_attention_layernorm.weight": layer.post_norm.weight,
                p + "self_attn.q_proj.weight": layer.q.weight, p + "self_attn.k_proj.weight": k,
                p + "self_attn.v_proj.weight": v, p + "self_attn.o_proj.weight": layer.o.weight,
                p + "self_attn.q_norm.weight": layer.q_norm.weight, p + "self_attn.k_norm.weight": layer.k_norm.weight,
                p + "mlp.gate_proj.weight": gate, p + "mlp.up_proj.weight": up,
                p + "mlp.down_proj.weight": layer.down.weight}
    head = model.head
    out["markov_head.markov_w1.weight"] = head.w1.weight
    out["markov_head.markov_w2.weight"] = head.w2.weight if head.w2 is not None else torch.zeros_like(head.w1.weight)
    if head.rnn is not None:
        out["markov_head.joint_proj.weight"] = head.rnn.weight
        out["markov_head.joint_proj.bias"] = head.rnn.bias
    out["confidence_head.proj.weight"] = model.confidence.proj.weight
    out["confidence_head.proj.bias"] = model.confidence.proj.bias
    return out


def engine_shapes(cfg: DraftConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor a drafter of `cfg` must ship in the engines' layout, with its shape (both engines load an
    incomplete checkpoint without a word)."""
    h, hd, r, v, inter = cfg.hidden_size, cfg.head_dim, cfg.markov_rank, cfg.vocab_size, cfg.intermediate_size
    nq, nkv = cfg.num_heads * hd, cfg.num_kv_heads * hd
    out: dict[str, tuple[int, ...]] = {
        "fc.weight": (h, cfg.context_width), "hidden_norm.weight": (h,), "norm.weight": (h,),
        "markov_head.markov_w1.weight": (v, r), "markov_head.markov_w2.weight": (v, r),
        "confidence_head.proj.weight": (1, h + r), "confidence_head.proj.bias": (1,)}
    for i in range(cfg.num_layers):
        p = f"layers.{i}."
        out |= {p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
                p + "self_attn.q_proj.weight": (nq, h), p + "self_attn.k_proj.weight": (nkv, h),
                p + "self_attn.v_proj.weight": (nkv, h), p + "self_attn.o_proj.weight": (h, nq),
                p + "self_attn.q_norm.weight": (hd,), p + "self_attn.k_norm.weight": (hd,),
                p + "mlp.gate_proj.weight": (inter, h), p + "mlp.up_proj.weight": (inter, h),
                p + "mlp.down_proj.weight": (h, inter)}
    if cfg.head == "rnn":
        out |= {"markov_head.joint_proj.weight": (3 * r, 2 * r + h), "markov_head.joint_proj.bias": (3 * r,)}
    return out


def expected_names(cfg: DraftConfig) -> set[str]:
    """Every tensor a drafter of `cfg` must ship in the engines' layout."""
    return set(engine_shapes(cfg))


def own_shapes(cfg: DraftConfig) -> dict[str, tuple[int, ...]]:
    """The state dict shapes of our module for `cfg` (the older dspark_config.json layout), built on the meta
    device: nothing is allocated."""
    with torch.device("meta"):
        model = DSparkDraftModel(cfg, torch.nn.Embedding(1, 1), torch.nn.Linear(1, 1))
    return {k: tuple(t.shape) for k, t in model.state_dict().items()}


def config_from_engine(data: dict[str, Any], where: str) -> DraftConfig:
    """Our DraftConfig from an engine-layout config.json (ours, or one of the same fields from elsewhere), typed and
    bounded first (draft_schema.py)."""
    check_engine_file(data, where)
    try:
        dflash = data.get("dflash_config") or {}
        ours = data.get("dspark_tune") or {}
        kind = str(data.get("markov_head_type", "vanilla")).lower()
        if kind not in ("vanilla", "rnn"):
            raise ValueError(f"markov_head_type {kind!r} (the bundled engine runs vanilla and rnn heads)")
        head = ours.get("head") or ("markov" if kind == "vanilla" else "rnn")
        if HEAD_TYPES.get(head) != kind:
            raise ValueError(f"dspark_tune.head {head!r} does not match markov_head_type {kind!r}")
        if not data.get("sample_from_anchor", True):
            raise ValueError("sample_from_anchor false (the bundled engine drafts from the anchor slot)")
        hidden, heads = int(data["hidden_size"]), int(data["num_attention_heads"])
        return DraftConfig(
            vocab_size=int(data["vocab_size"]), hidden_size=hidden,
            target_layers=[int(x) for x in dflash.get("target_layer_ids", data.get("target_layer_ids", []))],
            block_size=int(dflash.get("block_size", data.get("block_size", 7))), head=head,
            markov_rank=int(data["markov_rank"]), num_layers=int(data["num_hidden_layers"]), num_heads=heads,
            num_kv_heads=int(data.get("num_key_value_heads", heads)),
            head_dim=int(data.get("head_dim") or hidden // heads), intermediate_size=int(data["intermediate_size"]),
            rms_norm_eps=float(data.get("rms_norm_eps", 1e-6)), rope_theta=float(data.get("rope_theta", 10000.0)),
            mask_token_id=int(dflash.get("mask_token_id", data.get("mask_token_id"))),
            extra=dict(ours.get("extra") or {}))
    except (KeyError, TypeError, ValueError) as e:
        raise DSparkError(f"{where} is not a DSpark drafter config the bundled engine runs ({e})") from None


def state_from_engine(tensors: dict[str, torch.Tensor], cfg: DraftConfig, where: str) -> dict[str, torch.Tensor]:
    """Our module state dict from the engines' tensors (fused projections rebuilt); missing ones are an error."""
    names = {n.removeprefix("model.") for n in tensors}
    missing = sorted(expected_names(cfg) - names)
    if missing:
        raise DSparkError(f"drafter weights {where} lack {missing[:3]} ({len(missing)} missing); re-export them")
    t = {n.removeprefix("model."): v for n, v in tensors.items()}
    sd: dict[str, torch.Tensor] = {"ctx_proj.weight": t["fc.weight"], "ctx_norm.weight": t["hidden_norm.weight"],
                                   "norm.weight": t["norm.weight"], "head.w1.weight": t["markov_head.markov_w1.weight"],
                                   "confidence.proj.weight": t["confidence_head.proj.weight"],
                                   "confidence.proj.bias": t["confidence_head.proj.bias"]}
    if cfg.head != "none":
        sd["head.w2.weight"] = t["markov_head.markov_w2.weight"]
    elif t["markov_head.markov_w2.weight"].abs().max() > 0:
        raise DSparkError(f"drafter {where} says head none but its markov_w2 is not zero; fix dspark_tune.head")
    if cfg.head == "rnn":
        sd["head.rnn.weight"] = t["markov_head.joint_proj.weight"]
        sd["head.rnn.bias"] = t["markov_head.joint_proj.bias"]
    for i in range(cfg.num_layers):
        p, q = f"layers.{i}.", f"layers.{i}."
        sd |= {q + "input_norm.weight": t[p + "input_layernorm.weight"],
               q + "post_norm.weight": t[p + "post_attention_layernorm.weight"],
               q + "q.weight": t[p + "self_attn.q_proj.weight"],
               q + "kv.weight": torch.cat([t[p + "self_attn.k_proj.weight"], t[p + "self_attn.v_proj.weight"]]),
               q + "o.weight": t[p + "self_attn.o_proj.weight"], q + "q_norm.weight": t[p + "self_attn.q_norm.weight"],
               q + "k_norm.weight": t[p + "self_attn.k_norm.weight"],
               q + "gate_up.weight": torch.cat([t[p + "mlp.gate_proj.weight"], t[p + "mlp.up_proj.weight"]]),
               q + "down.weight": t[p + "mlp.down_proj.weight"]}
    return sd


def save_drafter(model: DSparkDraftModel, folder: str | Path, dtype: torch.dtype = torch.float16,
                 target_layers: int | None = None, max_positions: int = 32768) -> Path:
    """Write the drafter in the layout SGLang and vLLM load (dspark_core/drafters/dspark_layout.py): config.json +
    model.safetensors, without the shared embedding / LM head, each file atomically (an older dspark_config.json
    beside them is left alone: the loaders read config.json first). `target_layers`: the
    target's depth (default: one past the deepest context layer); `max_positions`: the target's context."""
    from safetensors.torch import save_file

    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    depth = target_layers if target_layers is not None else max(model.cfg.target_layers) + 1
    cfg = engine_config(model.cfg, depth, max_positions, dtype)
    tensors = {k: v.detach().to(dtype).contiguous().cpu() for k, v in engine_tensors(model).items()}
    for name, write in ((WEIGHTS_FILE, lambda p: save_file(tensors, p, metadata={"format": "pt"})),
                        (ENGINE_CONFIG, lambda p: Path(p).write_text(json.dumps(cfg, indent=2) + "\n"))):
        atomic_write(out / name, write)
    return out


def is_drafter(folder: str | Path) -> bool:
    """Whether `folder` holds a DSpark drafter in either layout."""
    p = Path(folder)
    return (p / WEIGHTS_FILE).is_file() and ((p / CONFIG_FILE).is_file() or engine_layout_config(p) is not None)


def engine_layout_config(folder: Path) -> dict | None:
    """The config.json of a drafter in the engines' layout (ours with dflash_config, or DeepSpec's flat one with
    architecture Qwen3DSparkModel), else None; one DSparkError line for a config.json that links out of the folder
    or is not JSON."""
    from dspark_core.modeling.arch import read_json_file
    from dspark_core.modeling.weights import inside

    path = Path(folder) / ENGINE_CONFIG
    if not path.is_file():
        return None
    data = read_json_file(inside(Path(folder), path))
    if not isinstance(data, dict):
        return None
    archs = data.get("architectures")
    return data if "dflash_config" in data or (isinstance(archs, list) and ARCHITECTURE in archs) else None


def read_drafter_config(folder: str | Path) -> DraftConfig:
    """The architecture of the drafter in `folder` (either layout), without loading its weights; typed and bounded
    (draft_schema.py), one DSparkError line naming the file otherwise."""
    from dspark_core.modeling.arch import read_json_file
    from dspark_core.modeling.weights import inside

    p = Path(folder)
    engine = engine_layout_config(p)
    legacy = p / CONFIG_FILE
    if engine is None and not legacy.is_file() and (p / ENGINE_CONFIG).is_file():
        check_engine_file(read_json_file(p / ENGINE_CONFIG), str(p / ENGINE_CONFIG))  # a list, or no markov_rank
    if not (p / WEIGHTS_FILE).is_file() or (engine is None and not legacy.is_file()):
        raise DSparkError(f"no DSpark drafter at {p} (need config.json with dflash_config + {WEIGHTS_FILE}); "
                          "train one with `python cli.py train-drafter`")
    if engine is not None:
        return config_from_engine(engine, str(p / ENGINE_CONFIG))
    checked = check_legacy_file(read_json_file(inside(p, legacy)), str(legacy))
    try:
        return DraftConfig(**{"mask_token_id": None, **checked.model_dump(exclude_unset=True)})
    except (TypeError, ValueError) as e:
        raise DSparkError(f"{legacy} is not a valid drafter config ({e}); retrain or fix it") from None


def load_drafter(folder: str | Path, target: LeanModel) -> DSparkDraftModel:
    """Load a drafter (the engines' layout, or the older dspark_config.json one) and attach it to `target`
    (same vocabulary and width). Its config is bounded, its weights file inside the folder, its header valid, its
    shapes those of the config and its size within free memory, all before the drafter is allocated."""
    from dspark_core.memory import ensure_fits
    from dspark_core.modeling.weights import check_shapes, inside, load_tensors, read_header

    p = Path(folder)
    cfg = read_drafter_config(p)
    engine = engine_layout_config(p)
    arch = target.arch
    if (cfg.vocab_size, cfg.hidden_size) != (arch.vocab_size, arch.hidden_size) or \
            max(cfg.target_layers) >= arch.num_hidden_layers:
        raise DSparkError(f"drafter {p} was trained for another target (vocab {cfg.vocab_size}, width "
                          f"{cfg.hidden_size}, layers {cfg.target_layers}); train one for this target")
    header = read_header(inside(p, p / WEIGHTS_FILE))
    if engine is not None:
        check_shapes([header], engine_shapes(cfg), p, "a DSpark drafter", strip="model.")
    else:
        check_shapes([header], own_shapes(cfg), p, "a DSpark drafter")
    ensure_fits({"drafter weights": cfg.num_params() * 4, "drafter tensors while loading": header.data_bytes}, "cpu",
                f"loading drafter {p}", "use a drafter with a smaller markov_rank or fewer layers, or free memory")
    model = DSparkDraftModel(cfg, target.embed, target.lm_head)
    sd = load_tensors(header)
    if engine is not None:
        sd = state_from_engine(sd, cfg, str(p / WEIGHTS_FILE))
    missing, unexpected = model.load_state_dict({k: v.float() for k, v in sd.items()}, strict=False)
    if missing or unexpected:
        raise DSparkError(f"drafter weights {p / WEIGHTS_FILE} do not match its config "
                          f"(missing {missing[:3]}, unexpected {unexpected[:3]}); retrain it")
    return model.to(device=target.device, dtype=target.dtype).eval()
