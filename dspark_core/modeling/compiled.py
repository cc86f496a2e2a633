"""The decode / verify step through `torch.compile` (gpt-fast's recipe): a few graphs, with dynamic sizes.

Eager PyTorch walks ~15 ops per layer from Python each step; compiled, a step is one inductor graph (C++/OpenMP
on a CPU, Triton on a GPU) whose pointwise work (norms, RoPE, SiLU, casts) is fused around the GEMMs.

* A step never retraces. Tokens per row T are padded to the next of the step sizes the engine runs (1 and its
  verify length, exactly: padding a 9-token verify to 16 costs 16 rows of GEMM; shorter drafts verify in that
  size too) or else a power of two up to 16 (padding writes past a row's length, which the next real tokens
  overwrite before anyone reads them, as in the eager model). On a CPU the rows B and the padded T, past one, are
  dynamic sizes: one graph for one row or several, one token or several, each read as a view or gathered (six in
  all, where buckets of B and T made 28 at 8 requests and four step sizes: a speculative engine starts 1.9x
  faster on a cold disk cache, RESULTS.md). Under CUDA graphs, which bake in their sizes, B pads to a power of two
  (padding repeats the last real row, whose KV writes are then identical to its own) and each (B, T) is a graph.
  The keys read per slot, Lk (the longest row's length after the step), is dynamic: one graph serves every context
  length, so a growing context never compiles mid-serving (attention masks past each row's position). So is the
  cache's slot count, for engines that share the step with caches of their own (`_adopt`).
  The KV cache is addressed by tensors (slots, positions), never by Python ints.
* Rows in consecutive slots read a view of their slots' cache; other batches gather their slots (a copy).
* A verify step (T > 1) on a CPU runs packed: only its N real tokens (a dynamic size, like Lk) go through the
  projections, the MLP and the LM head, and attention alone spans the [B, T] grid, so a row that verifies nothing
  costs its anchor, not T rows of GEMMs (vLLM and SGLang flatten a batch's tokens the same way). SmolLM2-135M bf16,
  8 rows x 9 with 20 real tokens: 45 ms packed, 79 ms dense (RESULTS.md, "Packed verify steps";
  verification/grid_costs.py prices rounds by it).
  Decode steps and CUDA-graph steps (static sizes) stay dense.
* Only steps of up to `MAX_T` tokens per row go through it (decode and verify); a prefill of fresh slots goes
  through its own graph on a CPU (modeling/compiled_prefill.py: prompts packed, causal attention over their
  own keys), and requests admitted while others run are prefilled inside the running batch's next verify step
  (modeling/compiled_mixed.py: one forward, attention split); any other long step runs eager.
* Compiling is bounded: once `budget_s` seconds have gone into first calls, shapes not yet compiled run eager.
  Inductor caches its code on disk (`TORCHINDUCTOR_CACHE_DIR`), so a restart loads a bucket in about a second.
* On a GPU each compiled shape is also captured in a CUDA graph and replayed (SGLang's and vLLM's decode): at batch
  1 the eager engine spends ~10x the HBM limit launching kernels, a captured step ~1.6x (benchmarks/gpu_step.py,
  H200). A graph bakes in its sizes and addresses, so the key span is padded to a power of two >= `SPAN_FLOOR`
  (masked like any key past a row's position), and a graph reading consecutive slots is keyed by its first slot.
  Graphs share one memory pool and write into output buffers shared per shape; the step returns copies.
* Attention over the cache in bf16 on an AVX512-BF16 CPU is our own kernel (modeling/cpu_attention.py, an opaque
  op in the graph), loaded before the first trace.
* The eager model is the reference: in fp32 a compiled step's greedy tokens equal eager's (tested).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from dspark_core.modeling import cpu_attention
from dspark_core.modeling.compiled_mixed import mixed_core, mixed_fits, mixed_inputs
from dspark_core.modeling.compiled_prefill import prefill_core, prefill_fits, prefill_inputs
from dspark_core.modeling.model import ForwardOut, KVCache, LeanModel, Packing, apply_rope, attend, prefix_lens

ROWS, TOKENS = "B", "T"  # a CPU graph's key for any row count past one, any verify length (dynamic sizes)
MAX_T = 17  # tokens per row a compiled step takes: the longest verify, a 16-token block + its anchor
SPAN_FLOOR = 256  # a CUDA graph's key span: the next power of two >= max(Lk, this), capped by the cache


def bucket(n: int, floor: int = 1) -> int:
    """The next power of two >= max(n, floor)."""
    return 1 << (max(n, floor) - 1).bit_length()


def _core(model: LeanModel, tokens: torch.Tensor, pos: torch.Tensor, slots: torch.Tensor,
          ks: list[torch.Tensor], vs: list[torch.Tensor], span: torch.Tensor, hidden_layers: tuple[int, ...],
          view: bool, packed: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """tokens, pos [B, T] long; slots [B] long; span [Lk] = arange(Lk) (dynamic) -> logits [B, T, V] float32,
    hidden [B, T, W] or None.

    Writes each row's K/V at (slot, pos) and attends over the slot's first Lk positions, masked past pos. With
    `view`, ks / vs are the rows' own slots in order (slots = 0..B-1) and are read without a gather. With `packed`
    ([N] long, dynamic: the flat grid position r * T + j of each real token), only those N tokens go through the
    projections, the MLP and the LM head (logits [N, V], hidden [N, W]); attention alone runs on the [B, T] grid."""
    b, t = tokens.shape
    lk = span.shape[0]
    mask = (span[None, None, :] <= pos[:, :, None])[:, None]  # [B, 1, T, Lk]
    lens = prefix_lens(pos, packed)  # [B, T] the mask as prefix lengths, 0 at a packed grid's padding
    rows = slots[:, None].expand(b, t)
    if packed is not None:  # the real tokens only: [N]
        tokens, pos, rows = tokens.reshape(-1)[packed], pos.reshape(-1)[packed], rows.reshape(-1)[packed]
    lead = tokens.shape  # (B, T) or (N,)
    freqs = pos.float()[..., None] * model.inv_freq  # [*lead, hd/2]
    emb = torch.cat((freqs, freqs), dim=-1)[..., None, :]
    cos, sin = emb.cos().to(model.dtype), emb.sin().to(model.dtype)  # [*lead, 1, hd]
    x = model.embed(tokens)  # [*lead, H]
    caught = []
    for i, layer in enumerate(model.layers):
        h = layer.input_norm(x)
        q, k, v = layer.qkv(h).split([layer.nh * layer.hd, layer.nkv * layer.hd, layer.nkv * layer.hd], dim=-1)
        q, k, v = (q.view(*lead, layer.nh, layer.hd), k.view(*lead, layer.nkv, layer.hd),
                   v.view(*lead, layer.nkv, layer.hd))
        if layer.q_norm is not None and layer.k_norm is not None:
            q, k = layer.q_norm(q), layer.k_norm(k)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        ks[i].index_put_((rows, pos), k.to(ks[i].dtype))
        vs[i].index_put_((rows, pos), v.to(vs[i].dtype))
        keys = (ks[i][:, :lk] if view else ks[i][slots, :lk]).to(q.dtype).transpose(1, 2)  # [B, nkv, Lk, hd]
        vals = (vs[i][:, :lk] if view else vs[i][slots, :lk]).to(q.dtype).transpose(1, 2)
        if packed is not None:  # packed queries -> the [B, T] grid (zeros at the padding, whose outputs are dropped)
            q = q.new_zeros(b * t, layer.nh, layer.hd).index_copy(0, packed, q).view(b, t, layer.nh, layer.hd)
        attn = attend(q.transpose(1, 2), keys, vals, mask, lens).transpose(1, 2)  # [B, T, nh, hd]
        attn = attn.reshape(b * t, -1)[packed] if packed is not None else attn.reshape(b, t, -1)
        x = x + layer.o(attn)
        gate, up = layer.gate_up(layer.post_norm(x)).chunk(2, dim=-1)
        x = x + layer.down(F.silu(gate) * up)
        if i in hidden_layers:
            caught.append(x)
    hidden = torch.cat(caught, dim=-1) if caught else None
    return model.lm_head(model.norm(x)).float(), hidden


def freeze_heap() -> None:
    """Move every object alive now into the collector's permanent generation (`gc.freeze`). Compiling leaves
    millions of long-lived Python objects (FX graphs, guards, sympy expressions) that each full collection would
    walk again: at 8 requests on chat the suffix method's plain rounds spent 18.3 ms outside their 22.5 ms step
    unfrozen and 1.5 ms frozen, its trees allocating nodes every round (benchmarks/round_trace.py; RESULTS.md,
    "Packed verify steps").
    vLLM freezes the heap after compiling and warming up (`freeze_gc_heap`), SGLang offers the same (`freeze_gc`)."""
    import gc

    gc.collect()
    gc.freeze()


def _dynamic(tensors: list[torch.Tensor], rows: bool, tokens: bool) -> None:
    """Mark the row dimension (0) and, for a [B, T] tensor, the token dimension (1) as dynamic sizes."""
    for x in tensors:
        if rows:
            torch._dynamo.mark_dynamic(x, 0)
        if tokens and x.dim() == 2 and x.dtype == torch.long:
            torch._dynamo.mark_dynamic(x, 1)


def _span(lk: int, device: torch.device) -> torch.Tensor:
    """[Lk] = arange(lk), its length the compiled graph's one dynamic dimension."""
    span = torch.arange(lk, device=device)
    torch._dynamo.mark_dynamic(span, 0)
    return span


def cuda_capture(run: Callable[[], None], pool: object) -> Callable[[], None]:
    """`run` warmed on a side stream, then captured in a CUDA graph in `pool`; returns the graph's replay."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            run()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        run()
    return graph.replay


@dataclass
class _Graph:
    """One captured step: its static inputs (copied into before each replay) and the graph's replay."""

    replay: Callable[[], None]
    tok: torch.Tensor  # [Bb, Tb] long
    pos: torch.Tensor  # [Bb, Tb] long
    idx: torch.Tensor  # [Bb] long


@dataclass
class CompiledStep:
    """`model`'s decode / verify forward through torch.compile, with the buckets it has compiled and what it took."""

    model: LeanModel
    sizes: tuple[int, ...] = (1,)  # tokens per row the engine steps with (decode, verify lengths): exact T buckets
    budget_s: float = float("inf")  # seconds of first calls (compiling) after which unseen shapes run eager
    fn: object = None  # the compiled _core
    seen: dict[tuple, float] = field(default_factory=dict)  # (B, T, hidden layers, view) -> first call's seconds
    refused: int = 0  # steps that ran eager because the budget was spent
    graphs: dict[tuple, _Graph] = field(default_factory=dict)  # (key, first slot, span) -> captured step (CUDA)
    outs: dict[tuple, tuple[torch.Tensor, torch.Tensor | None]] = field(default_factory=dict)  # key -> out buffers
    pool: object = None  # the graphs' shared CUDA memory pool
    use_graphs: bool | None = None  # replay CUDA graphs (default: on a GPU)
    graph_error: str = ""  # why capturing failed (the step then runs the compiled code uncaptured)
    pack: bool = True  # verify steps run their real tokens packed (`_core`'s `packed`; not under CUDA graphs)
    prefill_fn: object = None  # the compiled prefill (modeling/compiled_prefill.py; a CPU's, not under CUDA graphs)
    mixed_fn: object = None  # the compiled verify + prefill step (modeling/compiled_mixed.py)
    cache: KVCache | None = None  # the cache the last step ran on (`_adopt`)

    def __post_init__(self) -> None:
        import torch._dynamo
        import torch.fx.experimental._config

        torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 256)
        torch._dynamo.config.automatic_dynamic_shapes = False  # static buckets; only the marked sizes are dynamic
        torch.fx.experimental._config.use_duck_shape = False  # the key span and a packed step's N are two sizes
        if self.model.device.type == "cpu" and self.model.dtype == torch.bfloat16:
            cpu_attention.load()  # before tracing: a graph traced without the kernel keeps SDPA
        self.fn = torch.compile(_core, dynamic=None)
        self.prefill_fn = torch.compile(prefill_core, dynamic=None)
        self.mixed_fn = torch.compile(mixed_core, dynamic=None)
        if self.use_graphs is None:
            self.use_graphs = self.model.device.type == "cuda"

    def t_bucket(self, t: int) -> int:
        """The padded tokens per row of a t-token step: the smallest engine step size >= t (a short n-gram draft
        verifies in the block's graph: one graph per size, and a few rows more cost little next to the weights),
        else a power of two."""
        return min([s for s in self.sizes if t <= s <= MAX_T] or [bucket(t)])

    def takes(self, t: int, cache: KVCache, slots: list[int], hidden_layers: tuple[int, ...] = ()) -> bool:
        """Whether a step of `t` tokens per row goes through the compiled graph: a decode / verify step whose
        padded tokens still fit every slot, while the compile budget lasts or its shape is already compiled."""
        padded = self.t_bucket(t)
        if padded > MAX_T or int(cache.lens[slots].max()) + padded > cache.max_len:
            return False
        return self._affordable(self._key(t, cache, slots, hidden_layers))

    def _affordable(self, key: tuple) -> bool:
        """Whether a step of graph `key` runs compiled: already compiled, or the compile budget not yet spent (a refusal
        is counted: the warm line reports the shapes left eager)."""
        if sum(self.seen.values()) < self.budget_s or key in self.seen:
            return True
        self.refused += 1
        return False

    @staticmethod
    def _prefill_key(slots: list[int], hidden_layers: tuple[int, ...]) -> tuple:
        """The prefill's graph: one for a single row, one for two and more (rows a dynamic size)."""
        return "prefill", min(len(slots), 2), hidden_layers

    def takes_prefill(self, tokens: torch.Tensor, cache: KVCache, slots: list[int], n_new: list[int],
                      hidden_layers: tuple[int, ...] = ()) -> bool:
        """Whether a last-only forward goes through the compiled prefill: prompts from position 0 (fresh slots), not
        under CUDA graphs, while the compile budget lasts or its graph (one row, or several) is already compiled."""
        if self.use_graphs or not prefill_fits(tokens, cache, slots, n_new):
            return False
        return self._affordable(self._prefill_key(slots, hidden_layers))

    @torch.inference_mode()
    def prefill(self, tokens: torch.Tensor, cache: KVCache, slots: list[int], n_new: list[int],
                hidden_layers: tuple[int, ...] = ()) -> ForwardOut:
        """As LeanModel.forward(..., last_only=True) for a prefill `takes_prefill` accepts: logits [B, 1, V] of each
        row's last prompt token, hidden states packed [N, W]; the slots' lengths set to their prompts'."""
        dev = self.model.device
        self._adopt(cache)
        pos, rows, pack, last, grid = prefill_inputs(n_new, slots, dev)
        flat = tokens.reshape(-1)[pack.index.cpu()].to(dev)  # [N] the real tokens, row by row
        torch._dynamo.mark_dynamic(flat, 0)
        key = self._prefill_key(slots, hidden_layers)
        t0 = time.perf_counter()
        logits, hidden = self.prefill_fn(self.model, flat, pos, rows, pack.index, last, grid, cache.k, cache.v,
                                         hidden_layers)
        if key not in self.seen:
            self.seen[key] = time.perf_counter() - t0
        for r, s in enumerate(slots):
            cache.lens[s] = n_new[r]
        return ForwardOut(flat_logits=logits[:, None], flat_hidden=hidden, pack=pack, last_only=True)

    def takes_mixed(self, cache: KVCache, slots: list[int], pslots: list[int], plens: list[int],
                    hidden_layers: tuple[int, ...] = ()) -> bool:
        """Whether the rows in `slots` can verify up to MAX_T tokens each in one compiled step with the prompts
        (plens tokens each) of the fresh slots `pslots`: not under CUDA graphs, every row within its slot, while the
        compile budget lasts or the mixed graph is already compiled."""
        if self.use_graphs or not mixed_fits(cache, slots, pslots, plens, MAX_T):
            return False
        return self._affordable(("mixed", hidden_layers))

    @torch.inference_mode()
    def mixed(self, tokens: torch.Tensor, cache: KVCache, slots: list[int], n_new: list[int], prompts: torch.Tensor,
              pslots: list[int], plens: list[int], hidden_layers: tuple[int, ...] = ()
              ) -> tuple[ForwardOut, ForwardOut]:
        """A verify step of `tokens` [B, T] (n_new real a row) in `slots` and the prefill of `prompts` [Bp, Tp] (plens
        real a row) in the fresh slots `pslots`, one forward (modeling/compiled_mixed.py): (the step's ForwardOut as
        `__call__`'s packed one, the prefill's as `prefill`'s); the slots' lengths advanced."""
        dev = self.model.device
        self._adopt(cache)
        b, t = tokens.shape
        graph_new = [2] + n_new[1:] if sum(n_new) == 1 else n_new  # >= 2 real tokens: a lone decode row writes a
        # second, padding token past its length (overwritten before anyone reads it, as a padded step's)
        inp = mixed_inputs(cache, slots, graph_new, max(t, 2), pslots, plens, dev)
        bv, tv = inp["vpos"].shape
        vtok = torch.zeros(bv, tv, dtype=torch.long)
        vtok[:b, :t] = tokens
        ptok = prompts.reshape(-1)[inp["ppack"].index.cpu()].to(dev)  # [Np] the prompts' tokens, row by row
        vtok = vtok.to(dev)
        torch._dynamo.mark_dynamic(vtok, 0)
        torch._dynamo.mark_dynamic(vtok, 1)
        torch._dynamo.mark_dynamic(ptok, 0)
        starts = cache.lens[slots].clone()
        t0 = time.perf_counter()
        logits, hidden = self.mixed_fn(self.model, vtok, inp["vpos"], inp["vslots"], inp["vpack"].index, inp["span"],
                                       ptok, inp["ppos"], inp["prows"], inp["ppack"].index, inp["plast"],
                                       inp["pgrid"], cache.k, cache.v, hidden_layers)
        if ("mixed", hidden_layers) not in self.seen:
            self.seen["mixed", hidden_layers] = time.perf_counter() - t0
        for r, s in enumerate(slots):
            cache.lens[s] = int(starts[r]) + n_new[r]
        for r, s in enumerate(pslots):
            cache.lens[s] = plens[r]
        nv, ng = sum(n_new), sum(graph_new)
        step = ForwardOut(flat_logits=logits[:nv], flat_hidden=None if hidden is None else hidden[:nv],
                          pack=Packing.of(n_new, t, dev))
        fill = ForwardOut(flat_logits=logits[ng: ng + len(pslots), None], flat_hidden=None if hidden is None
                          else hidden[ng:], pack=inp["ppack"], last_only=True)
        return step, fill

    def _adopt(self, cache: KVCache) -> None:
        """A step on another cache than the last one (engines sharing this step: bench's methods, a tuner's trials,
        each with its own cache): its slot count is marked a dynamic size, so graphs that read the whole cache
        (gathered rows, prefills, mixed steps) serve every engine's (static, each slot count compiled its own); and
        CUDA graphs, which captured the other cache's addresses, are dropped.
        One slot stays static (a dynamic size is never 1): a lone request's steps read a view."""
        if cache is self.cache:
            return
        self.cache = cache
        self.graphs.clear()
        self.outs.clear()
        if len(cache.lens) >= 2:
            for t in (*cache.k, *cache.v):
                torch._dynamo.mark_dynamic(t, 0)

    def _key(self, t: int, cache: KVCache, slots: list[int], hidden_layers: tuple[int, ...]) -> tuple:
        """The graph a step runs: (rows, tokens per row, hidden layers, view). Under CUDA graphs rows pad to a power
        of two and tokens to the step size, each a graph of its own; on a CPU rows and tokens past one are dynamic
        sizes (`ROWS`, `TOKENS`), one graph each: six graphs where buckets made 28 at 8 requests and 4 step sizes,
        each 30-85 s to compile cold for SmolLM2's 30 layers on two cores, nearly all of it inductor's Python
        (RESULTS.md, "The compiled engine's start on a cold disk cache")."""
        b, tb = len(slots), self.t_bucket(t)
        view = slots == list(range(slots[0], slots[0] + b))
        if self.use_graphs:
            return bucket(b), tb, hidden_layers, view and bucket(b) == b
        return (1 if b == 1 else ROWS), (1 if tb == 1 else TOKENS), hidden_layers, view

    def warm(self, cache: KVCache, max_rows: int, hidden_layers: tuple[int, ...] = (),
             sizes: tuple[int, ...] | None = None) -> str:
        """Compile (or load from disk) the decode / verify graphs a serving engine meets: rows 1, 2, 4 .. max_rows at
        each step size, in consecutive slots and in scattered ones, then the prefill's (one row; two and more) and
        the verify step that prefills admitted requests (these write their slots' first positions: no request may be
        live), within the budget; a line saying what it took.
        Each graph serves every context length (dynamic keys). `hidden_layers`: the target layers the engine's
        drafter reads (a graph that also returns them is another graph). `sizes`: the engine's own step sizes, where
        engines share this step (bench, a tuner's trials): its steps of up to max(sizes) tokens a row pad to the
        shared sizes, so those are what it meets (a plain engine only 1); default all. What compiling left alive is
        then frozen out of the collector's sight (`freeze_heap`)."""
        t0, done, before_keys = time.perf_counter(), [], set(self.seen)

        def note(key: tuple, label: str) -> None:  # a graph this warm-up compiled (or loaded from disk)
            if key in self.seen and key not in before_keys and label not in done:
                done.append(label)

        batches = []  # slots in order (a view), then out of order (gathered: after requests finish)
        for b in (r for r in (1 << i for i in range(max_rows.bit_length())) if r <= max_rows):
            batches += [list(range(b))] + ([list(range(b))[::-1]] if b > 1 else [])
        if max_rows not in (len(x) for x in batches):  # a full batch of a non-power-of-two width (under CUDA
            batches.append(list(range(max_rows)))  # graphs it pads to the next bucket, a graph of its own)
        meets = self.sizes if sizes is None else sorted({self.t_bucket(t) for t in range(1, max(sizes) + 1)})
        for t in meets:
            for slots in batches:  # every size and batch runs once (no graph compiles mid-serving), however few graphs
                if not self.takes(t, cache, slots, hidden_layers):
                    continue
                b, before = len(slots), [int(n) for n in cache.lens[slots]]
                self(torch.zeros(b, t, dtype=torch.long), cache, slots, [t] * b, hidden_layers)
                for s, n in zip(slots, before, strict=True):
                    cache.truncate(s, n)
                key = self._key(t, cache, slots, hidden_layers)
                pad = f" (as {bucket(b)})" if self.use_graphs and bucket(b) > b else ""
                note(key, f"{key[0] if key[0] == ROWS else b}x{key[1] if key[1] == TOKENS else t}"
                          + ("" if key[3] or b == 1 else " gathered") + pad)
        for b in sorted({1, max_rows}):  # the prefill: one admitted request, and several (one graph for 2 and up)
            slots, before, prompts = list(range(b)), cache.lens.clone(), torch.zeros(b, 8, dtype=torch.long)
            cache.lens[slots] = 0  # a prefill starts its slots afresh (no request is live while warming)
            if self.takes_prefill(prompts, cache, slots, [8] * b, hidden_layers):
                self.prefill(prompts, cache, slots, [8] * b, hidden_layers)
                note(self._prefill_key(slots, hidden_layers), f"prefill {b} row{'s' if b > 1 else ''}")
            cache.lens.copy_(before)
        if max_rows >= 2:  # a verify step prefilling an admitted request (one graph for every mix)
            before = cache.lens.clone()
            cache.lens[0], cache.lens[1] = 4, 0
            if self.takes_mixed(cache, [0], [1], [8], hidden_layers):
                self.mixed(torch.zeros(1, 3, dtype=torch.long), cache, [0], [3], torch.zeros(1, 8, dtype=torch.long),
                           [1], [8], hidden_layers)
                note(("mixed", hidden_layers), "verify + prefill")
            cache.lens.copy_(before)
        freeze_heap()
        took = time.perf_counter() - t0
        skipped = f"; budget {self.budget_s:g} s spent, {self.refused} shapes left eager" if self.refused else ""
        hidden = f", with the hidden states of layers {list(hidden_layers)}" if hidden_layers else ""
        legend = f"; {ROWS}, {TOKENS}: any count past one" if not self.use_graphs else ""
        return (f"compiled {len(done)} step graphs (rows x tokens{legend}: {', '.join(done) or 'none new'}{hidden}) "
                f"in {took:.1f} s"
                f"{skipped}")

    @torch.inference_mode()
    def __call__(self, tokens: torch.Tensor, cache: KVCache, slots: list[int], n_new: list[int],
                 hidden_layers: tuple[int, ...]) -> ForwardOut:
        """As LeanModel.forward for a step `takes` accepts, the cache lengths advanced by n_new. A decode step (and
        any step under CUDA graphs) runs dense: [B, T, ...] outputs whose rows past n_new hold padding. A verify
        step on a CPU runs packed (`_core`'s `packed`, N = sum(n_new) a dynamic size): a 9-token verify whose rows
        verify 3, 1, .. tokens costs the GEMMs of those tokens, not of B x 9 (vLLM and SGLang flatten a batch's tokens
        the same way), and the outputs stay packed (ForwardOut.pack), as the eager model's ragged ones."""
        b, t = tokens.shape
        self._adopt(cache)
        key = self._key(t, cache, slots, hidden_layers)
        view = key[3]
        bb, tb = (bucket(b) if self.use_graphs else b), self.t_bucket(t)  # padded rows only under CUDA graphs
        starts = cache.lens[slots]  # [B]
        lk = max(int(starts.max()) + tb, 2)  # keys read per slot; >= 2: a dynamic size is never 0/1
        dev = self.model.device
        tok = torch.zeros(bb, tb, dtype=torch.long)
        tok[:b, :t] = tokens
        pos = starts[:, None] + torch.arange(tb)[None, :]  # [B, Tb]
        idx = torch.tensor(slots + [slots[-1]] * (bb - b), dtype=torch.long)
        if bb > b:  # padded rows repeat the last real row: identical writes
            tok[b:] = tok[b - 1]
            pos = torch.cat([pos, pos[-1:].expand(bb - b, tb)])
        ks, vs = cache.k, cache.v
        if view:  # the rows' own slots, in order: no gather
            ks, vs = [k[slots[0]: slots[0] + b] for k in ks], [v[slots[0]: slots[0] + b] for v in vs]
            idx = torch.arange(bb)
        if not self.use_graphs:  # one graph for every row count past one, and for every verify length
            _dynamic([tok, pos, idx, *(ks if view else []), *(vs if view else [])], rows=bb > 1, tokens=tb > 1)
        t0 = time.perf_counter()
        args = (tok.to(dev), pos.to(dev), idx.to(dev))
        logits = hidden = packed = None
        if tb > 1 and self.pack and not self.use_graphs:  # a verify step: only the real tokens go through the GEMMs
            packed = Packing.of(n_new, tb, dev).index  # [N] flat grid positions
            torch._dynamo.mark_dynamic(packed, 0)
        elif self.use_graphs and not self.graph_error:
            try:
                where = (slots[0] if view else -1, min(bucket(lk, SPAN_FLOOR), cache.max_len))  # padded span
                logits, hidden = self._replay(key, where, args, ks, vs)
            except RuntimeError as e:  # a step this GPU cannot capture: run uncaptured from now on (same writes)
                self.graph_error = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}" if str(e) else repr(e)
        if logits is None:
            logits, hidden = self.fn(self.model, *args, ks, vs, _span(lk, dev), hidden_layers, view, packed)
        if key not in self.seen:
            self.seen[key] = time.perf_counter() - t0
        for r, s in enumerate(slots):
            cache.lens[s] = int(starts[r]) + n_new[r]
        if packed is not None:
            return ForwardOut(flat_logits=logits, flat_hidden=hidden, pack=Packing.of(n_new, t, dev))
        return ForwardOut(flat_logits=logits[:b, :t], flat_hidden=None if hidden is None else hidden[:b, :t])

    def _replay(self, key: tuple, where: tuple[int, int], args: tuple[torch.Tensor, ...], ks: list[torch.Tensor],
                vs: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Run the step through the CUDA graph of (key, first slot, span), capturing it on first use; copies of
        the outputs (the shared buffers are overwritten by the next step of this shape)."""
        g = self.graphs.get((key, *where))
        if g is None:
            g = self._capture(key, where[1], args, ks, vs)
            self.graphs[(key, *where)] = g
        else:
            for buf, a in zip((g.tok, g.pos, g.idx), args, strict=True):
                buf.copy_(a)
        g.replay()
        logits, hidden = self.outs[key]
        return logits.clone(), None if hidden is None else hidden.clone()

    def _capture(self, key: tuple, lk: int, args: tuple[torch.Tensor, ...], ks: list[torch.Tensor],
                 vs: list[torch.Tensor]) -> _Graph:
        """Capture the compiled step over a key span of `lk` on static copies of this step's inputs. The warm-up
        calls run this very step (same tokens, same positions: the cache writes are the ones it makes anyway)."""
        _, _, hidden_layers, view = key
        tok, pos, idx = (a.clone() for a in args)
        span = _span(lk, tok.device)

        def run() -> None:
            logits, hidden = self.fn(self.model, tok, pos, idx, ks, vs, span, hidden_layers, view)
            if key not in self.outs:  # first warm-up call: the shape's output buffers (outside any graph)
                self.outs[key] = (torch.empty_like(logits), None if hidden is None else torch.empty_like(hidden))
            out_l, out_h = self.outs[key]
            out_l.copy_(logits)
            if out_h is not None:
                out_h.copy_(hidden)

        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle() if torch.cuda.is_available() else object()
        return _Graph(cuda_capture(run, self.pool), tok, pos, idx)


def attach(model: LeanModel, sizes: tuple[int, ...], budget_s: float) -> CompiledStep:
    """Route `model`'s decode / verify steps through a CompiledStep for these step sizes; a model shared by several
    engines (bench) keeps one step, with the union of their sizes."""
    if isinstance(model.compiled, CompiledStep):
        model.compiled.sizes = tuple(sorted({*model.compiled.sizes, *sizes}))
    else:
        model.compiled = CompiledStep(model, sizes=sizes, budget_s=budget_s)
    return model.compiled
