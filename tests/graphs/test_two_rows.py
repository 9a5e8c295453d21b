"""An ort target's GroupQueryAttention reads two rows at least (graphs/two_rows.py,
docs/design.md §12): a token's logits then have the same bits alone (k = 0) as among a
verification's k+1, which the kernel's one-row path did not give; the dummy row's cache row at
the context's last position is the arena's spare row."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

import tiny
from ssd_graphs import trace
from ssd_runtime import contract
from ssd_runtime.backends.ort import OrtCpuSession
from ssd_runtime.manifest import ModelEntry

MAX_CONTEXT = 48


def session(traced: trace.TracedModel, max_new: int = 8) -> OrtCpuSession:
    entry = ModelEntry(
        path=traced.path.name, architecture="llama", source="tiny",
        num_layers=traced.num_layers, num_kv_heads=traced.num_kv_heads,
        head_dim=traced.head_dim, vocab_size=traced.vocab_size, kv_dtype=traced.kv_dtype,
        logits_dtype="float32", inputs=contract.input_names(traced.num_layers, traced.graph),
        outputs=contract.output_names(traced.num_layers, traced.graph, False),
        graph=traced.graph, spare_rows=traced.spare_rows)
    return OrtCpuSession("target", traced.path, entry, MAX_CONTEXT, max_new, threads=2)


@pytest.fixture(scope="module")
def traces(tmp_path_factory) -> dict[bool, trace.TracedModel]:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny.config_for("llama", tiny.VOCAB, layers=2),
                                             attn_implementation="eager").eval()
    root = tmp_path_factory.mktemp("two_rows")
    return {exact: trace.export_decoder(model, "llama", root / str(exact) / "model.onnx",
                                        MAX_CONTEXT, contract.ORT, exact=exact)
            for exact in (False, True)}


def alone_and_together(s: OrtCpuSession, past: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(past)
    prompt, new = rng.integers(3, tiny.VOCAB, past), rng.integers(3, tiny.VOCAB, n)
    s.prefill(prompt, 0)
    together = np.array(s.forward(new, past))
    alone = np.stack([np.array(s.forward(new[i:i + 1], past + i))[0] for i in range(n)])
    return together, alone


def test_the_one_row_kernel_parts_and_two_rows_do_not(traces):
    together, alone = alone_and_together(session(traces[False]), 23, 5)
    assert not (together == alone).all(), "GroupQueryAttention's one-row path is exact now: " \
        "graphs/two_rows.py and design §12 can be revisited"
    together, alone = alone_and_together(session(traces[True]), 23, 5)
    assert (together == alone).all(), f"rows differ by {np.abs(together - alone).max(1)}"


def test_the_last_position_writes_its_dummy_into_the_spare_row(traces):
    """One token at position max_context - 1: its dummy's cache row is max_context, which only
    the spare row holds; its logits are its row of the two-token call before it."""
    exact = traces[True]
    assert exact.spare_rows == 1 and traces[False].spare_rows == 0
    s = session(exact)
    assert s.arena_shape[2] == MAX_CONTEXT + 1
    together, alone = alone_and_together(s, MAX_CONTEXT - 2, 2)
    assert (together == alone).all()


def test_the_rewrite_adds_two_nodes_a_layer_and_runs_once(traces, tmp_path):
    from ssd_graphs.two_rows import give_two_rows

    plain, exact = (onnx.load(str(traces[e].path), load_external_data=False).graph
                    for e in (False, True))
    gqa = sum(n.op_type == "GroupQueryAttention" for n in plain.node)
    per_call = len(exact.node) - len(plain.node) - 2 * gqa
    assert gqa == 2 and 0 < per_call <= 24
    copy = Path(tmp_path) / "model.onnx"
    onnx.save(onnx.load(str(traces[True].path), load_external_data=False), str(copy))
    assert give_two_rows(copy) is False                       # already two rows: untouched
