"""A target's row is a function of that row alone (issue 44, docs/design.md §12): its logits
have the same bits computed alone (k=0, one token) as among the k+1 rows of a verification,
so that speculation equals k=0 even where int8 activations would amplify a rounding
difference into a parted token."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from ssd_runtime import contract
from ssd_runtime.backends import cpu_session
from ssd_runtime.manifest import SCHEMA_VERSION, read_manifest, sha256_file

# (graph, target quant): every flavour's target is row-exact, float and quantized: the
# plain-ONNX flavours' attention products never run on one row (graphs/attention.py
# row_exact_matmul), the ort target's GroupQueryAttention reads two rows at least
# (graphs/two_rows.py; without them it parts, tests/graphs/test_two_rows.py)
EXACT = [("static", "int4"), ("static", "int8"), ("static", "none"), ("standard", "int4"),
         ("standard", "int8"), ("standard", "none"), ("ort", "int4"), ("ort", "int8"),
         ("ort", "none")]


def ids(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(3, 384, size=n).astype(np.int64)


def rows_alone_and_together(bundle) -> tuple[np.ndarray, np.ndarray]:
    """The target's logits for k+1 new tokens after a 23-token prompt: (one call, one token
    a call), both (T, V)."""
    m = read_manifest(bundle)
    session = cpu_session("target", bundle, m, threads=2)
    prompt, new = ids(23, 1), ids(m.max_draft + 1, 2)
    session.prefill(prompt, 0)
    together = np.array(session.forward(new, len(prompt)))                 # (T, V)
    alone = np.stack([np.array(session.forward(new[i:i + 1], len(prompt) + i))[0]
                      for i in range(len(new))])                          # (T, V)
    return together, alone


@pytest.mark.parametrize("graph,quant", EXACT, ids=["-".join(f) for f in EXACT])
def test_a_rows_logits_do_not_depend_on_the_rows_beside_it(bundle_factory, graph, quant):
    together, alone = rows_alone_and_together(
        bundle_factory("llama", "llama_cut", graph=graph, quant=quant))
    assert (together == alone).all(), f"rows differ by {np.abs(together - alone).max(1)}"


@pytest.mark.slow
def test_the_plain_static_layer_keeps_a_rows_bits_too(bundle_factory):
    """A target the fused layer does not take (q/k norms: qwen3) keeps the plain static layer
    (graphs/attention.py _attend_cache), whose rows are as exact (design §12)."""
    import onnx

    bundle = bundle_factory("qwen3", "llama_cut", graph="static", quant="int4")
    graph = onnx.load(str(bundle / read_manifest(bundle).target.path), load_external_data=False)
    assert "Attention" not in {n.op_type for n in graph.graph.node}
    together, alone = rows_alone_and_together(bundle)
    assert (together == alone).all(), f"rows differ by {np.abs(together - alone).max(1)}"


@pytest.mark.parametrize("graph", ["auto", pytest.param("standard", marks=pytest.mark.xfail(
    strict=True, reason="the standard flavour's attention spans the batch's longest past: a "
    "sequence's rows differ beside longer ones (why auto writes static, design §12)"))])
def test_a_quantized_targets_batch_equals_each_sequence_alone(bundle_factory, graph):
    """The default int4 bundle (auto: static flavour): B sequences of k+1 new tokens in one
    call give each sequence's logits as it alone; and generate_batch at k=auto (greedy and
    seeded) gives each prompt's own k=0 tokens."""
    from ssd_runtime import Generator

    bundle = bundle_factory("llama", "llama_cut", graph=graph, quant="int4")
    m = read_manifest(bundle)
    session = cpu_session("target", bundle, m, threads=2, max_batch=3)
    prompts = [ids(5 + 9 * b, 10 + b) for b in range(3)]
    new = np.stack([ids(m.max_draft + 1, 20 + b) for b in range(3)])         # (B, T)
    for b, prompt in enumerate(prompts):
        session.prefill(prompt, 0, slot=b)
    past = np.array([len(p) for p in prompts])
    together = np.array(session.forward_rows(new, past))                   # (B, T, V)
    for b in range(3):
        alone = np.array(session.forward(new[b], int(past[b]), slot=b))     # (T, V)
        assert (together[b] == alone).all(), f"sequence {b}"
    gen = Generator.load(bundle)
    asks = [p.tolist() for p in prompts]
    for settings in ({}, {"temperature": 0.9, "top_p": 0.95, "seed": 5}):
        alone = [gen.generate(p, max_new_tokens=24, k=0, **settings).token_ids for p in asks]
        batch = gen.generate_batch(asks, max_new_tokens=24, k="auto", **settings)
        assert [r.token_ids for r in batch] == alone, settings


@pytest.mark.parametrize("quant", ["int8", "int4", "none"])
def test_a_static_rows_bits_do_not_depend_on_how_many_rows_it_attends(bundle_factory, quant):
    """The static flavour attends over cache rows [0, L), L = the call's longest past +
    new_len (contract.ATTEND_ROWS, design §2): a short sequence alone (L its own length) and
    beside one near the end of the context (L ~ max_context) gives the same bits, at one new
    token (a decode step) and at k+1 (a verification)."""
    bundle = bundle_factory("llama", "llama_cut", graph="static", quant=quant)
    m = read_manifest(bundle)
    # (a target's last input is its draft trees' mask, schema 13: design §2 "Trees")
    assert m.target.graph == contract.STATIC and m.target.inputs[-2:] == [contract.ATTEND_ROWS,
                                                                          contract.TREE_MASK]
    session = cpu_session("target", bundle, m, threads=2, max_batch=2)
    assert session.attends_rows
    T = m.max_draft + 1
    prompts = [ids(5, 30), ids(m.max_context - T - 1, 31)]
    for b, prompt in enumerate(prompts):
        session.prefill(prompt, 0, slot=b)
    past = np.array([len(p) for p in prompts])
    new = np.stack([ids(T, 32), ids(T, 33)])                                  # (2, T)
    for width in (1, T):
        together = np.array(session.forward_rows(new[:, :width], past))       # (2, width, V)
        alone = np.array(session.forward(new[0, :width], int(past[0]), slot=0))
        assert (together[0] == alone).all(), \
            f"{width} tokens: differs by {np.abs(together[0] - alone).max()}"


def test_a_static_bundle_without_attend_rows_still_runs(bundle_factory, tmp_path):
    """A static bundle of schema 9 or older (its graph attends over every cache row, with no
    attend_rows input) loads and runs as before, with the same bits as today's graph, and its
    speculation still equals its k=0. Made here from today's by turning the input into a
    constant of max_context rows and rewriting the manifest as an older exporter wrote it."""
    import onnx
    from onnx import numpy_helper
    from ssd_runtime import Generator

    bundle = bundle_factory("llama", "llama_cut", graph="static", quant="int8")
    old = tmp_path / "old"
    shutil.copytree(bundle, old)
    m = read_manifest(bundle)
    graph_file = old / m.target.path
    model = onnx.load(str(graph_file), load_external_data=False)
    (attend,) = [i for i in model.graph.input if i.name == contract.ATTEND_ROWS]
    model.graph.input.remove(attend)
    model.graph.initializer.append(numpy_helper.from_array(
        np.zeros(m.max_context, np.int64), contract.ATTEND_ROWS))
    onnx.save(model, str(graph_file))
    data = json.loads((old / "manifest.json").read_text())
    assert data["schema_version"] == SCHEMA_VERSION >= 10
    data["schema_version"] = 9
    data["models"]["target"]["inputs"].remove(contract.ATTEND_ROWS)
    data["files"][m.target.path] = sha256_file(graph_file)
    (old / "manifest.json").write_text(json.dumps(data))

    sessions = []
    for root in (bundle, old):
        session = cpu_session("target", root, read_manifest(root), threads=2, max_batch=2)
        session.prefill(ids(40, 40), 0, slot=1)
        session.prefill(ids(9, 41), 0, slot=0)
        sessions.append(session)
    assert sessions[0].attends_rows and not sessions[1].attends_rows
    new = np.stack([ids(m.max_draft + 1, 42), ids(m.max_draft + 1, 43)])
    past = np.array([9, 40])
    for width in (1, m.max_draft + 1):
        today, before = (np.array(s.forward_rows(new[:, :width], past)) for s in sessions)
        assert (today == before).all(), f"{width} tokens"
        today, before = (np.array(s.forward(new[0, :width], 9)) for s in sessions)
        assert (today == before).all(), f"{width} tokens alone"
    gen = Generator.load(old)
    prompt = ids(11, 44).tolist()
    assert gen.generate(prompt, max_new_tokens=24, k="auto").token_ids == \
        gen.generate(prompt, max_new_tokens=24, k=0).token_ids
