"""The one decoder wrapper that gets traced: the graph contract of docs/design.md §2.

    inputs   input_ids (B,T), position_ids (B,T), past_key.i / past_value.i (B,P,Hkv,D)
    outputs  logits (B,T,V), new_key.i / new_value.i (B,T,Hkv,D)

Rows of a batch are ragged: row b's tokens sit at positions p_b .. p_b+T-1 with its own past
length p_b = position_ids[b, 0] <= P; past rows p_b .. P-1 are stale and masked, so the
runtime may bind each slot's whole cache (P = max_context). A row with fewer real tokens
than T is padded at the end, at the following positions; causality keeps the real tokens
from seeing the padding, whose outputs are ignored.

    key index   0 ...... p_b-1 | p_b ...... P-1 | P ............ P+T-1
    position    0 ...... p_b-1 | (stale: never) | p_b .......... p_b+T-1
                (causal and within the window, by position, as usual)

In the "ort" flavour (contract.py) the caches are whole head-major buffers
(B,Hkv,max_context,D) in and `present_key.i` / `present_value.i` out, updated in place by
ONNX Runtime's GroupQueryAttention (ort_ops.py). The "static" flavour and the ort target's
rows graph take the same caches, scatter the new rows into them, and attend over their first
L rows, L the length of one more input, attend_rows (L,) (attention.py).

It reuses the Hugging Face modules for embeddings, norms, MLPs and the LM head, and
does positions (attention.py, positions.py), attention and mixture-of-experts blocks
(moe.py) itself. The adapter says where the modules are and how a layer connects them.
"""
from __future__ import annotations

import torch
from ssd_runtime import contract
from ssd_runtime.errors import ConfigError
from torch import nn

from .adapters import Adapter, get_path, sliding_windows
from .attention import (Heads, OrtAttention, attention, cache_index, cache_positions,
                        causal_mask, key_positions, past_tree_mask, tree_mask)
from .fused import Fusion
from .moe import check_moe, cost_note, kernel_refusal, kernel_weights, moe, moe_block
from .positions import Rope, alibi_bias, alibi_slopes, log_position_scale

MASKED = -1e9        # a logit outside a draft's output vocabulary (ssd_export/loading.py)


_KERNEL_WEIGHTS = ("fc1", "fc1_bias", "fc2", "fc2_bias")     # moe.kernel_weights, per layer


class Decoder(nn.Module):
    def __init__(self, model: nn.Module, adapter: Adapter, flavour: str = contract.STANDARD,
                 max_context: int = 0, source: str = "model",
                 aux_layers: tuple[int, ...] = (), tree: bool = False) -> None:
        super().__init__()
        self.flavour = flavour
        # the standard and static flavours' and the rows graph's draft trees: contract.TREE_MASK
        # (B, T, T) after every other input (docs/design.md §2, "Trees"; the ort flavour's:
        # tree_input.py)
        self.tree = tree and flavour != contract.ORT
        # an EAGLE-3 head's features: the residual stream entering these layers, one more
        # output (contract.AUX_HIDDEN) concatenated in this order (docs/design.md §14)
        self.aux_layers = tuple(aux_layers)
        config = model.config
        a = self.adapter = adapter
        self.embed = get_path(model, a.embed)
        self.embed_norm = get_path(model, a.embed_norm)
        self.project_in = get_path(model, a.project_in)
        self.pos_embed = get_path(model, a.pos_embed) if a.positions == "learned" else None
        self.layers = nn.ModuleList(get_path(model, a.layers))
        self.final_norm = get_path(model, a.final_norm)
        self.project_out = get_path(model, a.project_out)
        self.lm_head = get_path(model, a.lm_head)
        self._init_output_vocab(model)
        # one Rope per distinct table; layer i uses ropes[rope_keys[i]] (None: no RoPE there)
        self.ropes, self.rope_keys = _ropes(model, a, len(self.layers))
        attn = [get_path(layer, a.attn) for layer in self.layers]
        num_heads = config.num_attention_heads
        num_kv_heads = a.num_kv_heads or getattr(config, "num_key_value_heads", None) or num_heads
        head_dim = a.latent.rank + a.latent.rope_dims if a.latent is not None \
            else int(getattr(attn[0], a.head_dim))
        self.heads = Heads(num_heads, num_kv_heads, head_dim)
        # GPT-2 may scale per layer; GPT-Neo does not scale
        self.scalings = [1.0 if a.scaling is None else float(getattr(m, a.scaling)) for m in attn]
        self.windows = a.windows or sliding_windows(config)
        self._init_moe(source)
        if flavour in (contract.ORT, contract.ROWS):   # rows: ort's packed q, k, v too
            self._init_ort(max_context)
        elif flavour == contract.STATIC:
            self._init_static()
        # the static and rows graphs' layer in fused operators where the model fits it (fused.py)
        self.fusion = Fusion.plan(self, max_context, pack_mlp=flavour == contract.STATIC) \
            if flavour in (contract.STATIC, contract.ROWS) else None
        if a.positions == "alibi":
            slopes = alibi_slopes(num_heads, a.alibi_dtype == "bfloat16")
            slopes = slopes.view(num_kv_heads, self.heads.groups)              # (Hkv, G)
            self.register_buffer("alibi_slopes", slopes, persistent=False)

    # KV shapes of the graph contract, read by trace.py
    @property
    def num_kv_heads(self) -> int:
        return self.heads.num_kv_heads

    @property
    def head_dim(self) -> int:
        return self.heads.head_dim

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor,
                *past: torch.Tensor) -> tuple[torch.Tensor, ...]:
        x = self.embed_input(input_ids, position_ids)               # (B, T, H)
        if self.flavour == contract.ORT:
            return self._forward_ort(x, position_ids, past)
        live_rows, tree = None, None
        if self.tree:                             # a draft tree's ancestors, last
            past, tree = past[:-1], past[-1]
        if contract.attends_rows(self.flavour):   # the last input's length: rows [0, L)
            past, live_rows = past[:-1], past[-1].shape[0]
        x, outputs, entering = self.decode(x, position_ids, past, live_rows, tree)
        return (self.lm_logits(x), *outputs, *self._aux(entering, x))

    def embed_input(self, input_ids: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        """The first layer's input (B, T, H): the embedding and what the model puts after it."""
        a = self.adapter
        x = self.embed(input_ids)                                   # (B, T, E)
        if a.embed_scale != 1.0:
            x = x * a.embed_scale
        if self.embed_norm is not None:
            x = self.embed_norm(x)
        if self.project_in is not None:
            x = self.project_in(x)                                  # (B, T, H)
        if self.pos_embed is not None:                              # learned absolute positions
            x = x + nn.functional.embedding(position_ids + a.pos_offset, self.pos_embed.weight)
        return x

    def decode(self, x: torch.Tensor, position_ids: torch.Tensor, past: tuple[torch.Tensor, ...],
               live_rows=None, tree: torch.Tensor | None = None
               ) -> tuple[torch.Tensor, list[torch.Tensor], dict[int, torch.Tensor]]:
        """Every layer over x (B, T, H) in the standard or static flavour: the last layer's
        output (before the final norm), the KV outputs, the stream entering each layer. An MTP
        head (mtp.py) calls this with its own first input in place of the embedding. `tree`:
        the call's tree mask (B, T, T); token t then sits at cache row position_ids[:, 0] + t
        (static, rows) or is new key t (standard), not at its position (docs/design.md §2,
        "Trees")."""
        a = self.adapter
        tables = {key: rope.tables(position_ids, x.dtype) for key, rope in self.ropes.items()}
        static = self.flavour in (contract.STATIC, contract.ROWS)
        if static:      # keys at their rows of the whole cache; beyond a query: not yet valid
            rows = past[0].shape[2] if live_rows is None else live_rows
            key_pos, key_valid = cache_positions(position_ids, rows)              # (B, R|L)
            # what depends on the call alone, once for every layer (docs/design.md §12)
            rows_at = position_ids if tree is None else position_ids[:, :1] + torch.arange(
                position_ids.shape[1], device=position_ids.device)[None, :]     # (B, T) rows
            index = cache_index(rows_at, self.heads.num_kv_heads)                 # 3 x (B,T,Hkv)
            qkv_tables = {key: self._qkv_tables(*tables[key]) for key in self.qkv_rotated}
        else:           # each row's own past length is position_ids[b, 0]; rows past it stale
            key_pos, key_valid = key_positions(position_ids, past[0].shape[1])    # (B, S)
            qkv_tables = {}
        masks = {w: causal_mask(position_ids, key_pos, key_valid, w) if tree is None  # (B,1,1,T,S)
                 else tree_mask(position_ids, key_pos, tree, w) if static
                 else past_tree_mask(position_ids, key_pos, key_valid, tree, w)
                 for w in set(self.windows)}
        if static and self.fusion is not None:
            return self.fusion.decode(self, x, position_ids, past, live_rows, masks,
                                      rows_at)
        alibi = None
        if a.positions == "alibi":                                  # (B, Hkv, G, 1, S)
            dtype = {"bfloat16": torch.bfloat16, "float32": torch.float32}.get(a.alibi_dtype,
                                                                              x.dtype)
            alibi = alibi_bias(self.alibi_slopes, key_pos, dtype)
        q_scale = self._q_scale(position_ids, x.dtype)
        outputs: list[torch.Tensor] = []
        entering: dict[int, torch.Tensor] = {}
        for i in range(len(self.layers)):
            entering[i] = x
            bias = masks[self.windows[i]]
            if alibi is not None:                                   # Falcon scales it like q·k
                bias = bias + (alibi * self.scalings[i] if a.alibi_scaled else alibi)
            packed = self.packed_projection(i)
            key = self.rope_keys[i]
            cos_sin = qkv_tables[key] if packed is not None and key in qkv_tables \
                else tables.get(key)
            x, new_k, new_v = self._layer(i, x, self._rope(i), cos_sin,
                                          past[2 * i], past[2 * i + 1], self.scalings[i], bias,
                                          q_scale=q_scale,
                                          scatter_at=index if static else None,
                                          live_rows=live_rows, packed=packed)
            outputs += [new_k, new_v]
        return x, outputs, entering

    def _aux(self, entering: dict[int, torch.Tensor], x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """(aux_hidden (B, T, n·Ht) float32,) from the streams entering each layer, or ().
        Layer L (one past the last) is the last layer's output after the final norm, Hugging
        Face's hidden_states[L]: what an MTP head reads (docs/design.md §14)."""
        if not self.aux_layers:
            return ()
        if len(self.layers) in self.aux_layers:
            entering[len(self.layers)] = x if self.final_norm is None else self.final_norm(x)
        return (torch.cat([entering[i] for i in self.aux_layers], dim=-1).float(),)

    def packed_projection(self, i: int) -> nn.Module | None:
        """Layer i's one projection [q | k | v] where the graph has one: the rows graph's (the
        ort flavour's packed weights, so the two graphs share them) and the static flavour's;
        else None."""
        if self.flavour not in (contract.ROWS, contract.STATIC) or \
                isinstance(self.packed[i], nn.Identity):
            return None
        return self.packed[i]

    def _init_static(self) -> None:
        """The static flavour: q, k and v as one packed projection where nothing sits between
        the projection and RoPE (as the ort flavour packs them), rotated together where RoPE
        spans the whole head (qkv_rotated: the rope keys whose tables _qkv_tables widens).
        Fewer nodes a step, the same maths (docs/design.md §12)."""
        a = self.adapter
        direct = a.latent is None and a.q_norm is None and a.qkv_clip is None \
            and a.q_position_scale is None
        self.packed = nn.ModuleList(_packed_qkv(get_path(layer, a.attn), a) if direct
                                    else nn.Identity() for layer in self.layers)
        self.qkv_rotated = self._whole_head_ropes() if direct else frozenset()

    def _whole_head_ropes(self) -> frozenset:
        """The rope keys whose rotation spans the whole head in the model's dtype: their tables
        widen to packed [q | k | v] (_qkv_tables), one rotation for all three."""
        return frozenset(key for key, rope in self.ropes.items()
                         if rope.precision == "model" and rope.rotary_dim == self.heads.head_dim)

    def _qkv_tables(self, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """cos, sin (B, T, 1, D) -> (B, T, H + 2·Hkv, D) over packed [q | k | v] heads: the
        tables for q and k, and 1, 0 for v, which a rotation then leaves as it is (v·1 + 0).

            cos·m + (1 - m), sin·m      m (H + 2·Hkv, 1): 1 for q and k heads, 0 for v
        """
        H, Hkv = self.heads.num_heads, self.heads.num_kv_heads
        m = torch.cat((torch.ones(H + Hkv, 1), torch.zeros(Hkv, 1))).to(cos.dtype)
        return cos * m + (1 - m), sin * m

    def lm_logits(self, x: torch.Tensor) -> torch.Tensor:
        a = self.adapter
        if self.final_norm is not None:
            x = self.final_norm(x)
        if self.project_out is not None:
            x = self.project_out(x)
        if self.output_ids is not None:                             # (B, T, m)
            logits = nn.functional.linear(x, self.output_weight, self.output_bias).float()
        else:
            logits = self.lm_head(x).float()                        # (B, T, V)
        if a.logit_scale != 1.0:
            logits = logits * a.logit_scale
        if a.logit_softcap is not None:
            logits = torch.tanh(logits / a.logit_softcap) * a.logit_softcap
        if self.output_ids is not None:     # the other V - m logits: MASKED, so q = 0 there
            full = logits.new_full((*logits.shape[:-1], self.vocab_size), MASKED)  # (B, T, V)
            index = self.output_ids.expand(*logits.shape[:-1], -1)               # (B, T, m)
            logits = full.scatter(-1, index, logits)
        return logits

    def _init_output_vocab(self, model: nn.Module) -> None:
        """A draft whose head covers only some ids (ssd-distill's `output_vocab.json`, read
        by ssd_export.loading): the head's matrix keeps those rows, and the graph scatters its
        m logits into the V the contract promises (docs/design.md §13).

            x (B,T,H) ─ MatMul W[ids]ᵀ (H,m) ─ scale, cap ─ ScatterElements into V ─ logits
        """
        ids = getattr(model, "ssd_output_ids", None)
        if ids is None:
            self.output_ids = None
            return
        weight = self.lm_head.weight.detach()
        self.vocab_size = int(weight.shape[0])
        self.register_buffer("output_ids", ids.clone(), persistent=False)
        self.output_weight = nn.Parameter(weight[ids].clone(), requires_grad=False)
        bias = getattr(self.lm_head, "bias", None)
        self.output_bias = None if bias is None else nn.Parameter(bias.detach()[ids].clone(),
                                                                  requires_grad=False)

    def _q_scale(self, position_ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor | None:
        scale = self.adapter.q_position_scale
        return None if scale is None else log_position_scale(position_ids, *scale, dtype)

    def _init_moe(self, source: str) -> None:
        """Mixture-of-experts layers (moe.py): dense, or in the `ort` flavour ONNX Runtime's
        MoE kernel where it computes them (its weights laid out as it reads them: a copy)."""
        spec, ort = self.adapter.moe, self.flavour == contract.ORT
        self.moe_layers = frozenset(spec.layers if spec is not None else ())
        self.moe_kernel, self.moe_note = False, ""
        if spec is None or not spec.layers:
            return
        num_experts = check_moe(self.layers, spec, source)
        refusal = kernel_refusal(self.layers, spec)
        self.moe_kernel = ort and not refusal
        self.moe_note = cost_note(spec, num_experts, ort, refusal)
        for i in spec.layers if self.moe_kernel else ():
            for name, w in zip(_KERNEL_WEIGHTS, kernel_weights(moe_block(self.layers[i], spec),
                                                               spec)):
                self.register_buffer(f"moe_{name}_{i}", w, persistent=False)

    @property
    def moe_kind(self) -> str:
        """How the MoE layers run (contract.MOES): none, dense or kernel."""
        return "kernel" if self.moe_kernel else "dense" if self.moe_layers else "none"

    def _rope(self, i: int) -> Rope | None:
        key = self.rope_keys[i]
        return None if key is None else self.ropes[key]

    def _init_ort(self, max_context: int) -> None:
        """The `ort` flavour: GroupQueryAttention over head-major caches updated in place.

        The kernel rotates q and k itself (from cos/sin tables of every position up to
        max_context) when every rotation is plain rotate-half over the whole head and nothing
        sits between the projection and RoPE; otherwise RoPE stays in the graph. Layers
        without RoPE (SmolLM3's) tell the kernel not to rotate.
        """
        a = self.adapter
        if a.positions == "alibi":
            raise ConfigError("the ort graph flavour has no ALiBi (ONNX Runtime's "
                              "GroupQueryAttention takes no per-head slopes); export with "
                              "--graph standard.")
        if self.heads.head_dim % 8:
            raise ConfigError(f"the ort graph flavour needs a head size that is a multiple of 8 "
                              f"(ONNX Runtime's GroupQueryAttention refuses others at run time); "
                              f"this model's is {self.heads.head_dim}. ---> HINT: export with "
                              f"--graph standard.")
        # the kernel rotates only heads of a multiple of 16 ("head_size shall be a multiple of
        # 16" at run time, for head size 24): other sizes keep RoPE in the graph
        self.ort_rotary = (len(self.ropes) > 0 and a.q_norm is None
                           and a.q_position_scale is None and self.heads.head_dim % 16 == 0
                           and all(
            r.rotary_dim == self.heads.head_dim and not r.interleaved for r in self.ropes.values()))
        self.ort_caches: dict[str, tuple[str, str]] = {}    # rope key -> buffer names
        for key, rope in (self.ropes.items() if self.ort_rotary else ()):
            freqs = torch.arange(max_context, dtype=torch.float32)[:, None] * rope.inv_freq
            names = (f"cos_cache_{key}", f"sin_cache_{key}")          # (max_context, D/2)
            self.register_buffer(names[0], freqs.cos() * rope.scale, persistent=False)
            self.register_buffer(names[1], freqs.sin() * rope.scale, persistent=False)
            self.ort_caches[key] = names
        self.register_buffer("no_cache", torch.zeros(1, 1), persistent=False)
        # the rows graph rotates its packed q, k and v together (_init_static)
        self.qkv_rotated = self._whole_head_ropes()
        # q, k, v as one packed projection (three MatMuls -> one) where nothing sits between
        # the projection and the kernel: no q/k norm, clip or q scale, RoPE in the kernel or none
        direct = [a.q_norm is None and a.qkv_clip is None and a.q_position_scale is None
                  and (self.ort_rotary or key is None) for key in self.rope_keys]
        self.packed = nn.ModuleList(_packed_qkv(get_path(layer, a.attn), a) if d else nn.Identity()
                                    for layer, d in zip(self.layers, direct))

    def _forward_ort(self, x: torch.Tensor, position_ids: torch.Tensor, caches) -> tuple:
        last = position_ids[:, -1]
        seqlens_k = last.to(torch.int32)
        total_len = (last.max() + 1).to(torch.int32)
        tables = {} if self.ort_rotary else {
            key: rope.tables(position_ids, x.dtype) for key, rope in self.ropes.items()}
        q_scale = self._q_scale(position_ids, x.dtype)
        outputs: list[torch.Tensor] = []
        entering: dict[int, torch.Tensor] = {}
        for i in range(len(self.layers)):
            entering[i] = x
            packed, key = self.packed[i], self.rope_keys[i]
            kernel_rotates = self.ort_rotary and key is not None
            cos, sin = (getattr(self, n).to(x.dtype) for n in self.ort_caches[key]) \
                if kernel_rotates else (self.no_cache.to(x.dtype),) * 2
            o = OrtAttention(seqlens_k, total_len, position_ids, cos, sin, kernel_rotates,
                             self.windows[i] or 0,
                             None if isinstance(packed, nn.Identity) else packed)
            x, cache_k, cache_v = self._layer(i, x, self._rope(i), tables.get(key),
                                              caches[2 * i], caches[2 * i + 1], self.scalings[i],
                                              None, o, q_scale)
            outputs += [cache_k, cache_v]
        return (self.lm_logits(x), *outputs, *self._aux(entering, x))

    def _layer(self, i: int, x: torch.Tensor, rope: Rope | None, cos_sin,
               past_k: torch.Tensor, past_v: torch.Tensor, scaling: float,
               bias: torch.Tensor | None, ort: OrtAttention | None = None,
               q_scale: torch.Tensor | None = None, scatter_at: torch.Tensor | None = None,
               live_rows=None, packed: nn.Module | None = None):
        """One block: pre- or post-norm, sequential or parallel residual.

            sequential pre:  x += s·attn(norm(x));  x += s·mlp(mlp_norm(x))
            parallel:        x += s·(attn(norm(x)) + mlp(mlp_norm(x) or norm(x)))
            sequential post: x = norm(x + attn(x));  x = mlp_norm(x + mlp(x))

        A missing norm is the identity; attn(.) and mlp(.) include their output norms; s is
        the residual scale (1 but for Granite).
        """
        a = self.adapter
        layer = self.layers[i]
        post = a.norm_position == "post"
        norm = _module(layer, a.input_norm)
        mlp_norm = getattr(layer, a.mlp_norm) if a.mlp_norm is not None else None
        h = x if post else norm(x)
        attn_out, new_k, new_v = attention(get_path(layer, a.attn), a, self.heads, scaling, h,
                                           rope, cos_sin, past_k, past_v, bias, ort, q_scale,
                                           scatter_at, live_rows, packed)
        if a.attn_out_norm is not None:
            attn_out = getattr(layer, a.attn_out_norm)(attn_out)
        if a.residual == "parallel":
            m = self.mlp_block(i, mlp_norm(x) if mlp_norm is not None else h)
            return x + self._scaled(attn_out + m), new_k, new_v
        x = norm(x + attn_out) if post else x + self._scaled(attn_out)
        m = self.mlp_block(i, x if post or mlp_norm is None else mlp_norm(x))
        x = mlp_norm(x + m) if post else x + self._scaled(m)
        return x, new_k, new_v

    def _scaled(self, branch: torch.Tensor) -> torch.Tensor:
        scale = self.adapter.residual_scale
        return branch if scale == 1.0 else branch * scale

    def mlp_block(self, i: int, h: torch.Tensor) -> torch.Tensor:
        a, layer = self.adapter, self.layers[i]
        if i in self.moe_layers:
            kernel = tuple(getattr(self, f"moe_{name}_{i}") for name in _KERNEL_WEIGHTS) \
                if self.moe_kernel else None
            h = moe(moe_block(layer, a.moe), a.moe, h, kernel)
        else:
            for name in a.mlp:
                h = get_path(layer, name)(h)
        if self.adapter.mlp_out_norm is not None:
            h = getattr(layer, self.adapter.mlp_out_norm)(h)
        return h


def _module(layer: nn.Module, name: str | None) -> nn.Module:
    return nn.Identity() if name is None else getattr(layer, name)


def _ropes(model: nn.Module, a: Adapter, n_layers: int) -> tuple[nn.ModuleDict, list[str | None]]:
    """The distinct RoPE tables (keyed by their prefix, "rope" for the plain one) and, per
    layer, which one it uses (None: no RoPE on that layer, or no RoPE at all)."""
    if a.positions != "rope":
        return nn.ModuleDict(), [None] * n_layers
    prefixes = a.layer_rope if a.layer_rope is not None else ("",) * n_layers
    if len(prefixes) != n_layers:
        raise ConfigError(f"the config gives RoPE settings for {len(prefixes)} layers but the "
                          f"model has {n_layers}; check layer_types / no_rope_layers.")
    keys = [None if p is None else (p.rstrip("_") or "rope") for p in prefixes]
    rotary = None if a.rope_base else get_path(model, a.rotary)
    ropes = nn.ModuleDict()
    for prefix, key in zip(prefixes, keys):
        if key is not None and key not in ropes:
            ropes[key] = Rope.from_base(*a.rope_base, a.rope_interleaved, a.rope_precision) \
                if a.rope_base else Rope.from_module(rotary, prefix, a.rope_interleaved,
                                                     a.rope_precision, a.rope_scale)
    return ropes, keys


def _packed_qkv(attn: nn.Module, a: Adapter) -> nn.Module:
    """The module computing [q | k | v]: a fused projection in that layout as it is, one Linear
    built from separate q, k, v Linears, else Identity (the grouped layout; other modules)."""
    if a.qkv is not None:
        return getattr(attn, a.qkv) if a.qkv_layout == "split" else nn.Identity()
    parts = [getattr(attn, name) for name in (a.q, a.k, a.v)]
    if not all(type(p) is nn.Linear for p in parts):
        return nn.Identity()
    weight = torch.cat([p.weight for p in parts])
    packed = nn.Linear(weight.shape[1], weight.shape[0], bias=any(p.bias is not None for p in parts),
                       dtype=weight.dtype, device=weight.device)
    with torch.no_grad():
        packed.weight.copy_(weight)
        if packed.bias is not None:
            packed.bias.copy_(torch.cat([p.bias if p.bias is not None else
                                         torch.zeros(p.out_features, dtype=weight.dtype)
                                         for p in parts]))
    return packed.eval()
