"""The EAGLE-3 head (graphs/eagle3.py): both published layouts, the maths against Hugging Face's
Llama parts, the vocabulary map, the features of a real tiny Llama, and bad head folders."""
from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file
from ssd_graphs.decoder import MASKED
from ssd_graphs.eagle3 import (SAFEAILAB, SPECULATORS, Eagle3Config, Eagle3Head, aux_hidden,
                               load_head, save_safeailab)
from ssd_runtime.errors import ConfigError

V, VD, H, HT = 96, 40, 32, 48       # target vocab, draft vocab, head width, target width

# The published tensor names (SafeAILab's cnets.Model; speculators' Eagle3Speculator) with
# their shapes for CONFIG: 4 heads, 2 KV heads, head size 8, MLP 64.
MID = {"hidden_norm.weight": (H,), "input_layernorm.weight": (H,),
       "self_attn.q_proj.weight": (32, 2 * H), "self_attn.k_proj.weight": (16, 2 * H),
       "self_attn.v_proj.weight": (16, 2 * H), "self_attn.o_proj.weight": (H, 32),
       "post_attention_layernorm.weight": (H,), "mlp.gate_proj.weight": (64, H),
       "mlp.up_proj.weight": (64, H), "mlp.down_proj.weight": (H, 64)}
TOP = {"fc.weight": (H, 3 * HT), "norm.weight": (H,), "lm_head.weight": (VD, H)}

LAYER = dict(hidden_size=H, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
             head_dim=8, rms_norm_eps=1e-5, rope_theta=500000.0, max_position_embeddings=256,
             hidden_act="silu", vocab_size=V, num_hidden_layers=1)


def published_tensors(seed: int = 0, embed: bool = True) -> dict[str, torch.Tensor]:
    """Random weights under the published names, with a valid d2t / t2d pair."""
    g = torch.Generator().manual_seed(seed)
    out = {f"midlayer.{k}": torch.randn(s, generator=g) * 0.3 for k, s in MID.items()}
    out.update({k: torch.randn(s, generator=g) * 0.3 for k, s in TOP.items()})
    targets = torch.randperm(V, generator=g)[:VD].sort().values        # draft i -> targets[i]
    out["d2t"] = targets - torch.arange(VD)
    out["t2d"] = torch.zeros(V, dtype=torch.bool)
    out["t2d"][targets] = True
    if embed:
        out["embed_tokens.weight"] = torch.randn(V, H, generator=g)
    return out


def write_safeailab(folder, tensors, *, bin_file=False, **config):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", **LAYER,
        "draft_vocab_size": VD, "target_hidden_size": HT,
        "eagle_aux_hidden_state_layer_ids": [0, 2, 3], **config}))
    if bin_file:
        torch.save(tensors, folder / "pytorch_model.bin")
    else:
        save_file({k: v.contiguous() for k, v in tensors.items()}, folder / "model.safetensors")
    return folder


def write_speculators(folder, tensors, **config):
    folder.mkdir(parents=True, exist_ok=True)
    layer = {**LAYER, "model_type": "llama", "architectures": ["LlamaForCausalLM"]}
    (folder / "config.json").write_text(json.dumps({
        "architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3",
        "transformer_layer_config": layer, "draft_vocab_size": VD, "norm_before_residual": True,
        "target_hidden_size": HT, "eagle_aux_hidden_state_layer_ids": [0, 2, 3],
        "speculators_config": {"algorithm": "eagle3", "proposal_methods": [
            {"proposal_type": "greedy", "speculative_tokens": 3}],
            "default_proposal_method": "greedy", "verifier": {"name_or_path": "tiny"}},
        **config}))
    renamed = {k.replace("midlayer.", "layers.0."): v for k, v in tensors.items()}
    save_file({k: v.contiguous() for k, v in renamed.items()}, folder / "model.safetensors")
    return folder


def reference_step(t: dict[str, torch.Tensor], c: Eagle3Config, ids, hidden, pos):
    """The EAGLE-3 layer written out from SafeAILab's cnets.py with Hugging Face's Llama parts
    (rotary table, rotate-half, repeat_kv), no cache: (draft logits, hidden_out)."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import (LlamaRotaryEmbedding,
                                                          apply_rotary_pos_emb, repeat_kv)

    def rms(x, w):
        return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + c.rms_norm_eps))

    m = {k[len("midlayer."):]: v for k, v in t.items() if k.startswith("midlayer.")}
    B, T = ids.shape
    emb = t["embed_tokens.weight"][ids]
    normed = rms(hidden, m["hidden_norm.weight"])
    residual = normed if c.norm_before_residual else hidden
    x = torch.cat((rms(emb, m["input_layernorm.weight"]), normed), -1)
    q = (x @ m["self_attn.q_proj.weight"].T).view(B, T, 4, 8).transpose(1, 2)
    k = (x @ m["self_attn.k_proj.weight"].T).view(B, T, 2, 8).transpose(1, 2)
    v = (x @ m["self_attn.v_proj.weight"].T).view(B, T, 2, 8).transpose(1, 2)
    rope = LlamaRotaryEmbedding(config=LlamaConfig(**{**LAYER, "rope_parameters": {
        "rope_type": "default", "rope_theta": c.rope_theta}}))
    cos, sin = rope(v, pos)
    q, k = apply_rotary_pos_emb(q, k, cos, sin)
    k, v = repeat_kv(k, 2), repeat_kv(v, 2)
    scores = q @ k.transpose(2, 3) / 8 ** 0.5
    scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    a = (scores.softmax(-1) @ v).transpose(1, 2).reshape(B, T, 32) @ m["self_attn.o_proj.weight"].T
    x = residual + a
    y = rms(x, m["post_attention_layernorm.weight"])
    y = (torch.nn.functional.silu(y @ m["mlp.gate_proj.weight"].T) * (y @ m["mlp.up_proj.weight"].T)
         ) @ m["mlp.down_proj.weight"].T
    out = x + y
    return rms(out, t["norm.weight"]) @ t["lm_head.weight"].T, out


def _inputs(config: Eagle3Config, T: int = 6, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, V, (2, T), generator=g)
    aux = torch.randn(2, T, 3 * config.target_hidden_size, generator=g)
    pos = torch.arange(T).repeat(2, 1)
    return ids, aux, pos


@pytest.mark.parametrize("layout", ["safeailab", "safeailab-bin", "speculators"])
def test_published_layouts_load_and_match_the_written_out_layer(tmp_path, layout):
    tensors = published_tensors()
    if layout == "speculators":
        folder = write_speculators(tmp_path / layout, tensors)
    else:
        folder = write_safeailab(tmp_path / layout, tensors, bin_file=layout.endswith("bin"))
    config, head, kind = load_head(folder)
    assert kind == (SPECULATORS if layout == "speculators" else SAFEAILAB)
    assert config.aux_layer_ids == (0, 2, 3) and config.target_hidden_size == HT
    assert config.norm_before_residual is (layout == "speculators")
    assert head.own_embedding
    state = head.state_dict()
    for name, value in tensors.items():
        assert torch.equal(state[name], value.to(state[name].dtype)), name
    ids, aux, pos = _inputs(config)
    with torch.no_grad():
        hidden = head.fuse(aux)
        logits, out, _ = head(ids, hidden, pos)
        want_logits, want_out = reference_step(tensors, config, ids, hidden, pos)
    torch.testing.assert_close(out, want_out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(logits, want_logits, atol=1e-4, rtol=1e-5)


def test_both_layouts_of_one_head_are_equal_modules(tmp_path):
    tensors = published_tensors(seed=3)
    a = load_head(write_safeailab(tmp_path / "a", tensors, norm_before_residual=True))[1]
    b = load_head(write_speculators(tmp_path / "b", tensors))[1]
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
    ids, aux, pos = _inputs(a.config)
    with torch.no_grad():
        assert torch.equal(a(ids, a.fuse(aux), pos)[0], b(ids, b.fuse(aux), pos)[0])


def test_save_safeailab_round_trip_and_the_embedding_from_the_target(tmp_path):
    tensors = published_tensors(seed=4, embed=False)
    config, head, _ = load_head(write_safeailab(tmp_path / "in", tensors))
    assert not head.own_embedding
    target_embed = torch.randn(V, H)
    head.set_embedding(target_embed)
    save_safeailab(head, config, tmp_path / "out")
    written = json.loads((tmp_path / "out" / "config.json").read_text())
    assert written["architectures"] == ["LlamaForCausalLMEagle3"]
    assert written["draft_vocab_size"] == VD
    assert written["eagle_aux_hidden_state_layer_ids"] == [0, 2, 3]
    from safetensors.torch import load_file
    assert "embed_tokens.weight" not in load_file(tmp_path / "out" / "model.safetensors")
    again_config, again, _ = load_head(tmp_path / "out", embed_weight=target_embed)
    assert again_config == config
    ids, aux, pos = _inputs(config)
    with torch.no_grad():
        assert torch.equal(head(ids, head.fuse(aux), pos)[0], again(ids, again.fuse(aux), pos)[0])
    with pytest.raises(ConfigError, match=r"\(96, 32\)"):
        again.set_embedding(torch.zeros(V + 1, H))


def test_target_logits_scatter_through_d2t():
    tensors = published_tensors(seed=5)
    config = Eagle3Config.from_safeailab_config({**LAYER, "draft_vocab_size": VD,
                                                 "target_hidden_size": HT,
                                                 "eagle_aux_hidden_state_layer_ids": [0, 2, 3]})
    head = Eagle3Head(config)
    head.load_state_dict(tensors, strict=False)
    draft = torch.randn(2, 3, VD)
    full = head.target_logits(draft)                                # (2, 3, V)
    targets = torch.arange(VD) + tensors["d2t"]                     # target id = draft id + d2t
    assert torch.equal(full[..., targets], draft)
    others = torch.ones(V, dtype=torch.bool)
    others[targets] = False
    assert (full[..., others] == MASKED).all()
    assert int(full.argmax(-1)[0, 0]) == int(targets[draft.argmax(-1)[0, 0]])


def test_a_cached_step_equals_the_whole_block():
    config, head, _ = _loaded_head()
    ids, aux, pos = _inputs(config, T=7)
    with torch.no_grad():
        hidden = head.fuse(aux)
        whole, whole_out, (keys, _) = head(ids, hidden, pos)
        first, _, past = head(ids[:, :4], hidden[:, :4], pos[:, :4])
        rest, rest_out, (keys2, _) = head(ids[:, 4:], hidden[:, 4:], pos[:, 4:], past)
    torch.testing.assert_close(torch.cat((first, rest), 1), whole, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(rest_out, whole_out[:, 4:], atol=1e-5, rtol=1e-5)
    assert keys2.shape == keys.shape == (2, 7, 2, 8)


def test_aux_hidden_is_the_residual_stream_entering_those_layers():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=V, hidden_size=HT, intermediate_size=96,
                                         num_hidden_layers=5, num_attention_heads=4,
                                         num_key_value_heads=2)).eval()
    entering = {}
    for i, layer in enumerate(model.model.layers):
        layer.register_forward_pre_hook(
            lambda mod, args, kwargs, i=i: entering.__setitem__(i, (args[0] if args else
                                                                  kwargs["hidden_states"])),
            with_kwargs=True)
    ids = torch.randint(0, V, (1, 9))
    with torch.no_grad():
        states = model(ids, output_hidden_states=True).hidden_states
    aux = aux_hidden(states, (4, 1, 2))                             # in the order given
    assert aux.shape == (1, 9, 3 * HT)
    assert torch.equal(aux, torch.cat((entering[4], entering[1], entering[2]), -1))
    assert Eagle3Config.default_aux_layer_ids(32) == (2, 16, 29)


def _loaded_head(tmp_path=None):
    config = Eagle3Config.from_speculators_config({
        "transformer_layer_config": LAYER, "draft_vocab_size": VD, "target_hidden_size": HT,
        "eagle_aux_hidden_state_layer_ids": [0, 2, 3], "speculators_model_type": "eagle3"})
    head = Eagle3Head(config)
    head.load_state_dict(published_tensors(seed=6), strict=False)
    return config, head.eval(), SPECULATORS


def _truncate(folder):
    path = folder / "model.safetensors"
    path.write_bytes(path.read_bytes()[:-100])


BAD = {
    "missing tensor": (lambda t: t.pop("midlayer.self_attn.k_proj.weight"), None,
                       "lacks midlayer.self_attn.k_proj.weight"),
    "misshapen tensor": (lambda t: t.__setitem__("fc.weight", torch.zeros(H, 3 * H)), None,
                         r"fc.weight is \(32, 96\), its config.json implies \(32, 144\)"),
    "truncated file": (None, _truncate, "weights cannot be read.*truncated or corrupt"),
    "corrupt d2t": (lambda t: t.__setitem__("d2t", torch.full((VD,), V)), None,
                    "d2t does not map"),
    "second layer": (lambda t: t.__setitem__("layers.1.mlp.up_proj.weight", torch.zeros(64, H)),
                     None, "decoder layers 1 beyond the first"),
}


@pytest.mark.parametrize("case", BAD)
def test_bad_head_folders_are_one_clear_error(tmp_path, case):
    edit, after, message = BAD[case]
    tensors = published_tensors()
    if edit is not None:
        edit(tensors)
    folder = write_safeailab(tmp_path / "head", tensors)
    if after is not None:
        after(folder)
    with pytest.raises(ConfigError, match=message):
        load_head(folder)


def test_safeailabs_training_config_reads_as_its_layout(tmp_path):
    """SafeAILab's traineagle3/config.json names LlamaForCausalLM beside draft_vocab_size."""
    from ssd_graphs.eagle3 import is_head

    folder = write_safeailab(tmp_path / "head", published_tensors(),
                             architectures=["LlamaForCausalLM"])
    assert is_head(folder) and load_head(folder)[2] == SAFEAILAB
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    assert not is_head(plain)


@pytest.mark.parametrize("config, message", [
    ({"architectures": ["MistralForCausalLM"]}, "not an EAGLE-3 head in a known layout"),
    ({"speculators_model_type": "eagle"}, "not 'eagle3'"),
    ({"eagle_aux_hidden_state_layer_ids": [3, 2, 0]}, "not three increasing layer numbers"),
    ({"eagle_aux_hidden_state_layer_ids": None}, "no target depth was given"),
    ({"num_hidden_layers": 2}, "2 decoder layers"),
    ({"rope_scaling": {"type": "dynamic", "factor": 2.0}}, "dynamic RoPE"),
])
def test_bad_head_configs_are_one_clear_error(tmp_path, config, message):
    folder = write_safeailab(tmp_path / "head", published_tensors(), **config)
    with pytest.raises(ConfigError, match=message):
        load_head(folder)
