"""What the ONNX Runtime sessions here share (ort.py, ort_cuda.py, the rows graph): their
options, the check that this onnxruntime runs a graph's operators, and IOBinding's bind and
run called past the Python wrapper's own layers (docs/design.md §3, §5).
"""
from __future__ import annotations

from .. import contract
from ..errors import BackendError
from ..manifest import ModelEntry


def session_options(threads: int | None, entry: ModelEntry | None = None):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    if entry is not None and entry.quant_form == contract.DEQUANTIZE:
        # ONNX Runtime fuses DequantizeLinear + MatMul into MatMulNBits: compute as exported
        # and checked (docs/design.md §12)
        opts.add_session_config_entry(contract.QDQ_ACCURACY,
                                      str(entry.quant_scheme.get("accuracy_level", 4)))
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    if threads:
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    # Spin while a run is on, sleep the moment it returns: the target and the draft take
    # turns on the same cores, and a pool that keeps spinning after its run takes them from
    # the other model (docs/design.md §9; the figures: docs/performance-notes.md §9,
    # "Spinning").
    opts.add_session_config_entry("session.force_spinning_stop", "1")
    opts.log_severity_level = 3
    return opts


def binders(binding, device: str, device_id: int):
    """bind_input / bind_output as f(name, dtype, shape, address).

    ONNX Runtime's Python wrapper builds a device object on every bind; a call makes
    2 + 4·layers binds, so on a small draft that is a sizeable part of a step. Through its
    pybind object directly, with the device object made once, a bind skips it (figures:
    docs/performance-notes.md, "Figures from code comments"). Falls back to the public
    wrapper if that object is not there.
    """
    try:
        from onnxruntime.capi.onnxruntime_inference_collection import OrtDevice

        raw, where = binding._iobinding, OrtDevice.make(device, device_id)._get_c_device()
    except (ImportError, AttributeError):
        return (lambda name, dtype, shape, ptr:
                binding.bind_input(name, device, device_id, dtype, shape, ptr),
                lambda name, dtype, shape, ptr:
                binding.bind_output(name, device, device_id, dtype, shape, ptr))
    return (lambda name, dtype, shape, ptr: raw.bind_input(name, where, dtype, shape, ptr),
            lambda name, dtype, shape, ptr: raw.bind_output(name, where, dtype, shape, ptr))


def runner(session, binding):
    """session.run_with_iobinding(binding) without the wrapper's own Python layer, which a
    small draft pays on every step; the public call where that layer's attributes are not
    there."""
    try:
        run, raw = session._sess.run_with_iobinding, binding._iobinding
    except AttributeError:
        return lambda: session.run_with_iobinding(binding)
    return lambda: run(raw, None)


def check_onnxruntime(name: str, entry: ModelEntry) -> None:
    import onnxruntime as ort

    oldest = contract.oldest_onnxruntime(entry.graph, entry.quant, entry.moe,
                                         entry.quant_form or contract.MATMULNBITS, entry.fused)
    if oldest and contract.version_tuple(ort.__version__) < oldest[0]:
        need = contract.version_text(oldest[0])
        raise BackendError(f"the {name} graph has {oldest[1]}, which onnxruntime "
                           f"{ort.__version__} runs wrongly or not at all (it needs {need} or "
                           f"newer). ---> HINT: pip install -U 'onnxruntime>={need}', or "
                           f"re-export with ssd-export --graph standard --draft-quant none.")
