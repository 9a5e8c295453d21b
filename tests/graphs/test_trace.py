"""tests/torchlib_once.py: with it, torch's exporter builds its op registry from this process's
copy of torchlib's list, and the graph it writes is the one it writes without it."""
from __future__ import annotations

import torch

import tiny
import torchlib_once
from ssd_graphs import trace


def test_reading_torchlib_once_writes_the_same_graph(tmp_path):
    """The whole ModelProto, weights read in: nodes (op, domain, names, inputs, outputs,
    attributes), initializers byte for byte, inputs and outputs with their shapes."""
    from transformers import AutoModelForCausalLM
    from torch.onnx._internal._lazy_import import onnxscript_apis

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny.config_for("llama", tiny.VOCAB, layers=1),
                                             attn_implementation="eager").eval()
    with torchlib_once.read_once():
        onnxscript_apis.get_torchlib_ops()      # the copy is made
        once = trace.export_decoder(model, "llama", tmp_path / "once" / "model.onnx", 64, "ort")
    with torchlib_once.as_shipped():
        assert "get_torchlib_ops" not in vars(onnxscript_apis)
        plain = trace.export_decoder(model, "llama", tmp_path / "plain" / "model.onnx", 64,
                                     "ort")
    assert describe(once.path) == describe(plain.path)
    assert proto(once.path) == proto(plain.path)


def test_the_list_is_read_once_per_process(monkeypatch):
    from torch.onnx._internal._lazy_import import onnxscript_apis

    with torchlib_once.as_shipped():        # whatever the session set, the count starts here
        reads = []
        real = onnxscript_apis.get_torchlib_ops     # onnxscript's own, behind the handle

        def counted():
            reads.append(1)
            return real()

        monkeypatch.setattr(onnxscript_apis._module, "get_torchlib_ops", counted)
        lists = []
        for _ in range(3):
            with torchlib_once.read_once():
                lists.append(onnxscript_apis.get_torchlib_ops())
            assert "get_torchlib_ops" not in vars(onnxscript_apis)
    assert len(reads) == 1 and len(lists[0]) > 400
    assert all(a is b for a, b in zip(lists[0], lists[2]))     # the same metas, in order
    assert lists[0] is not lists[2]                 # a fresh list each time: none is shared


def describe(path) -> list[tuple]:
    """The graph as (op, domain, inputs, outputs) per node and (name, dims) per initializer:
    a readable difference when the protos differ."""
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    return ([(n.op_type, n.domain, tuple(n.input), tuple(n.output)) for n in graph.node]
            + [(t.name, tuple(t.dims)) for t in graph.initializer])


def proto(path) -> bytes:
    """The ModelProto with its weights read in, serialized."""
    import onnx

    return onnx.load(str(path)).SerializeToString()
