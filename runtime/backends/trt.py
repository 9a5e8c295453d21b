"""TensorRT backend (backend "trt"): one engine per model, one execution context per profile.

The only runtime module that imports `tensorrt` and cuda-python, and only inside
functions, so importing it costs nothing. KV arenas live on the device with the
zero-copy binding of docs/design.md §3: the past is the prefix of each layer's buffer and
the new rows are written at row past_len. TensorRT wants every tensor address
256-byte aligned, so that binding needs rows of a multiple of 256 bytes (true for
real models: Hkv·D·2 bytes); otherwise new rows land in a scratch buffer and are
copied into place on the device (n rows per call, never the past).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from .. import contract
from ..engines import DECODE, PREFILL, GpuInfo, Profile
from ..errors import BackendError
from ..manifest import EngineEntry, ModelEntry
from .base import DTYPES
from .device import DeviceLogits

ALIGNMENT = 256       # bytes; IExecutionContext::setTensorAddress requires it
CUDA_PYTHON_HINT = ("---> HINT: pip install 'cuda-python>=12.3,<13' (cuda-python 13 needs "
                    "driver 580 or later; 12.x runs on any driver from 525 and beside "
                    "tensorrt-cu12)")


def in_place_kv(row_bytes: int) -> bool:
    """Whether new-KV outputs may be bound inside the arena at any row past_len."""
    return row_bytes % ALIGNMENT == 0


def cuda_runtime():
    """cuda-python's runtime module (cuda.bindings.runtime; cuda.cudart before 12.6)."""
    try:
        from cuda.bindings import runtime as cudart
    except ImportError:
        try:
            from cuda import cudart
        except ImportError:
            raise BackendError(f"cuda-python is not installed; the TensorRT backend needs it "
                               f"for device memory and streams. {CUDA_PYTHON_HINT}") from None
    return cudart


def probe_tensorrt() -> tuple[str | None, GpuInfo | None, str]:
    """(TensorRT version, GPU 0, problem): what `auto` needs to know, without a context."""
    try:
        import tensorrt as trt

        version = str(trt.__version__)
    except Exception as exc:       # ImportError, or a placeholder package that fails on import
        return None, None, f"TensorRT is not installed ({type(exc).__name__}: {exc})"
    if problem := too_old(version):
        return None, None, problem
    try:
        cudart = cuda_runtime()
        count = _call(cudart, cudart.cudaGetDeviceCount(), "cudaGetDeviceCount")
        if count < 1:
            return version, None, "no CUDA GPU is visible"
        return version, device_info(0), ""
    except BackendError as exc:    # e.g. cudaErrorInsufficientDriver: cuda-python too new
        return version, None, f"{exc} {CUDA_PYTHON_HINT}"


def too_old(version: str) -> str:
    """Why this TensorRT cannot serve ("" when it can): the backend and the engine builder are
    written against TensorRT 10 (name-based IO, execute_async_v3; under 8.x create_network(0)
    makes an implicit-batch network that the ONNX parser refuses with an obscure error)."""
    try:
        major = int(version.split(".")[0])
    except ValueError:
        return ""
    if major >= 10:
        return ""
    return (f"TensorRT {version} is installed, and the trt backend and ssd-build-engines need "
            f"TensorRT 10 (JetPack 6.1 or later on Jetson)")


def device_info(device: int = 0) -> GpuInfo:
    cudart = cuda_runtime()
    props = _call(cudart, cudart.cudaGetDeviceProperties(device), "cudaGetDeviceProperties")
    name = props.name
    if isinstance(name, (bytes, bytearray)):
        name = bytes(name).split(b"\0", 1)[0].decode(errors="replace")
    return GpuInfo(str(name).strip(), f"{props.major}.{props.minor}")


class TrtSession:
    """A deserialised engine with a decode context (profile 0) and a prefill context (1)."""

    backend, device = "trt", "cuda"
    threads = 1                    # one host thread drives the device

    def __init__(self, name: str, plan_path: Path, entry: ModelEntry, record: EngineEntry,
                 max_context: int, max_new_len: int, device_id: int = 0) -> None:
        import tensorrt as trt

        self.name, self.entry, self.record, self.device_id = name, entry, record, device_id
        self.max_context, self.max_new_len = max_context, max_new_len
        self.cudart = cuda_runtime()
        kinds = self.cudart.cudaMemcpyKind
        self._kinds = {"H2D": kinds.cudaMemcpyHostToDevice, "D2H": kinds.cudaMemcpyDeviceToHost,
                       "D2D": kinds.cudaMemcpyDeviceToDevice}
        self._buffers: list[_Buffer] = []
        self.contexts: list = []
        self._cuda(self.cudart.cudaSetDevice(device_id), "cudaSetDevice")
        self.engine = self._deserialize(trt, plan_path)
        self._check_io(trt)
        self.profiles = self._profiles()
        self.stream = self._cuda(self.cudart.cudaStreamCreate(), "cudaStreamCreate")
        self.contexts = [self._context(i) for i in (DECODE, PREFILL)]
        self._shapes: list[dict[str, tuple]] = [{}, {}]      # last input shapes per context
        # graph names per layer and the refusal context, formatted once, not on every call
        self.layer_names = [(contract.past_key(i), contract.past_value(i), contract.new_key(i),
                             contract.new_value(i)) for i in range(entry.num_layers)]
        self._where = f"{self.name} engine {self.record.path}"
        self._addresses: list[dict[str, int]] = [{}, {}]
        self._allocate()

    # -- the ModelSession interface ------------------------------------------------------

    def forward(self, token_ids: np.ndarray, past_len: int) -> DeviceLogits:
        n = len(token_ids)
        if n > self.max_new_len:
            raise BackendError(f"{self.name}: {n} new tokens exceed this session's "
                               f"{self.max_new_len}; use prefill for long inputs.")
        self._run(DECODE, token_ids, past_len, self.logits.ptr)
        return DeviceLogits(self.logits.ptr, n, self.entry.vocab_size, np.float32, "cuda",
                            self._rows_to_host, self.device_id)

    def top(self) -> None:
        return None                  # engines are built from standard graphs, which have none

    def prefill(self, token_ids: np.ndarray, past_len: int = 0) -> None:
        for start in range(0, len(token_ids), self.prefill_chunk):
            chunk = token_ids[start:start + self.prefill_chunk]
            self._run(PREFILL, chunk, past_len + start, self.prefill_logits.ptr)

    def close(self) -> None:
        """Free device memory and the stream (also done when the session is collected)."""
        self.contexts = []
        for buf in self._buffers:
            buf.free()
        self._buffers = []
        if getattr(self, "stream", None) is not None:
            self.cudart.cudaStreamDestroy(self.stream)
            self.stream = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    # -- one call -------------------------------------------------------------------------

    def _run(self, index: int, token_ids: np.ndarray, past_len: int, logits_ptr: int) -> None:
        n = len(token_ids)
        if past_len + n > self.max_context:
            raise BackendError(f"{self.name}: positions up to {past_len + n} exceed the bundle's "
                               f"max_context {self.max_context}.")
        self.profiles[index].check(n, past_len, self._where)
        if self.device_id:
            self._cuda(self.cudart.cudaSetDevice(self.device_id), "cudaSetDevice")
        self.ids_host[0, :n] = token_ids
        self.positions_host[0, :n] = np.arange(past_len, past_len + n)
        self._copy(self.ids.ptr, self.ids_host.ctypes.data, n * self.ids_host.itemsize, "H2D")
        self._copy(self.positions.ptr, self.positions_host.ctypes.data,
                   n * self.positions_host.itemsize, "H2D")
        e = self.entry
        shapes = {contract.INPUT_IDS: (1, n), contract.POSITION_IDS: (1, n)}
        addresses = {contract.INPUT_IDS: self.ids.ptr, contract.POSITION_IDS: self.positions.ptr,
                     contract.LOGITS: logits_ptr}
        if self.mask is not None:
            if self._mask_n != n:
                self.mask_host[:n * n] = np.tri(n, dtype=np.bool_).reshape(-1)
                self._copy(self.mask.ptr, self.mask_host.ctypes.data, n * n, "H2D")
                self._mask_n = n
            shapes[contract.TREE_MASK] = (1, n, n)
            addresses[contract.TREE_MASK] = self.mask.ptr
        offset = past_len * self.row_bytes
        past_shape = (1, past_len, e.num_kv_heads, e.head_dim)                 # (B, P, Hkv, D)
        for i, (past_k, past_v, new_k, new_v) in enumerate(self.layer_names):
            k, v = self.keys[i].ptr, self.values[i].ptr
            shapes[past_k] = shapes[past_v] = past_shape
            # past = rows [0, past_len) of the arena; new rows at [past_len, past_len + n)
            addresses[past_k], addresses[past_v] = k, v
            addresses[new_k] = k + offset if self.in_place else self.new_keys[i].ptr
            addresses[new_v] = v + offset if self.in_place else self.new_values[i].ptr
        context = self.contexts[index]
        self._set_shapes(index, context, shapes)
        self._set_addresses(index, context, addresses)
        if not context.execute_async_v3(int(self.stream)):
            raise BackendError(f"{self.name}: TensorRT execute_async_v3 failed for new_len={n}, "
                               f"past_len={past_len} on {self.record.path}; the TensorRT log "
                               f"above says why.")
        if not self.in_place:       # rows not 256-byte aligned: copy the n new rows into place
            for i in range(e.num_layers):
                self._copy(self.keys[i].ptr + offset, self.new_keys[i].ptr, n * self.row_bytes,
                           "D2D")
                self._copy(self.values[i].ptr + offset, self.new_values[i].ptr,
                           n * self.row_bytes, "D2D")
        # the heads run on ONNX Runtime's own stream: the logits must be complete on return
        self._cuda(self.cudart.cudaStreamSynchronize(self.stream), "cudaStreamSynchronize")

    def _set_shapes(self, index: int, context, shapes: dict[str, tuple]) -> None:
        last = self._shapes[index]
        for name, shape in shapes.items():
            if last.get(name) == shape:
                continue                      # re-set shapes only when they change
            if not context.set_input_shape(name, shape):
                low, opt, high = (tuple(d) for d in
                                  self.engine.get_tensor_profile_shape(name, index))
                raise BackendError(f"{self.name}: TensorRT refused shape {shape} for {name!r} in "
                                   f"its {self.profiles[index].name} profile (min {low}, opt "
                                   f"{opt}, max {high}) on {self.record.path}.")
            last[name] = shape

    def _set_addresses(self, index: int, context, addresses: dict[str, int]) -> None:
        last = self._addresses[index]
        for name, ptr in addresses.items():
            if last.get(name) == ptr:
                continue
            if not context.set_tensor_address(name, ptr):
                raise BackendError(f"{self.name}: TensorRT refused the address 0x{ptr:x} for "
                                   f"{name!r} (it needs {ALIGNMENT}-byte alignment).")
            last[name] = ptr

    def _rows_to_host(self, first: int, count: int) -> np.ndarray:
        out = np.empty((count, self.entry.vocab_size), np.float32)               # (rows, V)
        row = self.entry.vocab_size * out.itemsize
        self._copy(out.ctypes.data, self.logits.ptr + first * row, out.nbytes, "D2H")
        self._cuda(self.cudart.cudaStreamSynchronize(self.stream), "cudaStreamSynchronize")
        return out

    # -- setting up -----------------------------------------------------------------------

    def _deserialize(self, trt, plan_path: Path):
        here = device_info(self.device_id)
        where = (f"{plan_path} (built for {self.record.gpu_name}, TensorRT "
                 f"{self.record.tensorrt_version}; this machine: {here.name}, TensorRT "
                 f"{trt.__version__})")
        self._logger = trt.Logger(trt.Logger.ERROR)
        self._runtime = trt.Runtime(self._logger)
        if self.record.version_compatible:          # the plan embeds its lean runtime
            self._runtime.engine_host_code_allowed = True
        try:
            blob = plan_path.read_bytes()
        except OSError as exc:
            raise BackendError(f"cannot read TensorRT engine {plan_path}: {exc}") from None
        engine = self._runtime.deserialize_cuda_engine(blob)
        if engine is None:
            raise BackendError(f"TensorRT could not deserialise {where}. ---> HINT: rebuild with "
                               f"ssd-build-engines BUNDLE --force on this machine.")
        if engine.num_optimization_profiles != 2:
            raise BackendError(f"{plan_path} has {engine.num_optimization_profiles} optimisation "
                               f"profiles, expected 2 (decode, prefill). ---> HINT: rebuild it "
                               f"with ssd-build-engines --force.")
        return engine

    def _profiles(self) -> tuple[Profile, Profile]:
        """The engine's own ranges (the manifest copy is for people)."""
        def ranges(tensor: str, axis: int, index: int) -> tuple[int, int, int]:
            low, opt, high = self.engine.get_tensor_profile_shape(tensor, index)
            return int(low[axis]), int(opt[axis]), int(high[axis])

        past = contract.past_key(0)
        return tuple(Profile(name, ranges(contract.INPUT_IDS, 1, i), ranges(past, 1, i))
                     for name, i in (("decode", DECODE), ("prefill", PREFILL)))

    def _check_io(self, trt) -> None:
        e, engine = self.entry, self.engine
        found = {engine.get_tensor_name(i) for i in range(engine.num_io_tensors)}
        wanted = set(contract.input_names(e.num_layers)) | set(contract.output_names(e.num_layers))
        wanted |= {contract.TREE_MASK} if e.tree else set()     # a tree bundle's (design §2)
        if found != wanted:
            raise BackendError(f"{self.record.path} does not follow the graph contract: "
                               f"missing {sorted(wanted - found)[:3]}, extra "
                               f"{sorted(found - wanted)[:3]}. ---> HINT: rebuild the engines "
                               f"with ssd-build-engines --force.")
        kv = DTYPES[e.kv_dtype]
        expect = {contract.past_key(0): kv, contract.new_key(0): kv, contract.LOGITS: np.float32}
        for tensor, dtype in expect.items():
            have = np.dtype(trt.nptype(engine.get_tensor_dtype(tensor)))
            if have != np.dtype(dtype):
                raise BackendError(f"{self.record.path}: {tensor!r} is {have}, expected "
                                   f"{np.dtype(dtype)} as in the manifest. ---> HINT: rebuild "
                                   f"with ssd-build-engines --force.")
        self.ids_dtype = np.dtype(trt.nptype(engine.get_tensor_dtype(contract.INPUT_IDS)))

    def _context(self, index: int):
        context = self.engine.create_execution_context()
        if context is None:
            raise BackendError(f"{self.name}: TensorRT could not create an execution context for "
                               f"{self.record.path} (out of device memory?).")
        try:   # TensorRT 10's binding raises RuntimeError where the C++ call returns false
            accepted = context.set_optimization_profile_async(index, int(self.stream))
        except RuntimeError:
            accepted = False
        if not accepted:
            raise BackendError(f"{self.name}: TensorRT refused optimisation profile {index} of "
                               f"{self.record.path}.")
        return context

    def _allocate(self) -> None:
        e = self.entry
        itemsize = np.dtype(DTYPES[e.kv_dtype]).itemsize
        self.row_bytes = e.num_kv_heads * e.head_dim * itemsize
        self.in_place = in_place_kv(self.row_bytes)
        self.prefill_chunk = self.profiles[PREFILL].new_len[2]
        rows = max(self.max_new_len, self.prefill_chunk)
        vocab_bytes = e.vocab_size * 4                                       # float32 logits
        arena = self.max_context * self.row_bytes                            # (C, Hkv, D)
        self.keys = [self._alloc(arena) for _ in range(e.num_layers)]
        self.values = [self._alloc(arena) for _ in range(e.num_layers)]
        if not self.in_place:
            self.new_keys = [self._alloc(rows * self.row_bytes) for _ in range(e.num_layers)]
            self.new_values = [self._alloc(rows * self.row_bytes) for _ in range(e.num_layers)]
        self.ids = self._alloc(rows * self.ids_dtype.itemsize)
        self.positions = self._alloc(rows * self.ids_dtype.itemsize)
        self.logits = self._alloc(self.max_new_len * vocab_bytes)            # (T, V)
        self.prefill_logits = self._alloc(self.prefill_chunk * vocab_bytes)  # discarded
        self.ids_host = np.zeros((1, rows), self.ids_dtype)
        self.positions_host = np.zeros((1, rows), self.ids_dtype)
        # a tree bundle's target takes contract.TREE_MASK bool (1, n, n) on every call: a
        # chain's lower triangle, uploaded when n changes (no tree is verified here: design §9)
        self.mask = self._alloc(rows * rows) if e.tree else None
        self.mask_host = np.zeros(rows * rows, np.bool_) if e.tree else None
        self._mask_n = 0

    def _alloc(self, nbytes: int) -> _Buffer:
        buf = _Buffer(self, max(nbytes, ALIGNMENT))
        self._buffers.append(buf)
        return buf

    def _copy(self, dst: int, src: int, nbytes: int, kind: str) -> None:
        result = self.cudart.cudaMemcpyAsync(dst, src, nbytes, self._kinds[kind], self.stream)
        _call(self.cudart, result, lambda: f"{self.name}: cudaMemcpyAsync {kind} of {nbytes} bytes")

    def _cuda(self, result, what: str):
        return _call(self.cudart, result, lambda: f"{self.name}: {what}")


class _Buffer:
    """cudaMalloc'd device memory (cudaMalloc aligns to at least 256 bytes)."""

    def __init__(self, session: TrtSession, nbytes: int) -> None:
        self.cudart, self.nbytes = session.cudart, nbytes
        self.ptr = int(session._cuda(session.cudart.cudaMalloc(nbytes),
                                     f"cudaMalloc({nbytes} bytes)"))

    def free(self) -> None:
        if self.ptr:
            self.cudart.cudaFree(self.ptr)
            self.ptr = 0


def _call(cudart, result, what):
    """cuda-python returns (error, *values): raise on anything but cudaSuccess. `what` names
    the call: a string, or a function giving it (formatted only on failure, off the hot path)."""
    err, *values = result if isinstance(result, tuple) else (result,)
    if err != cudart.cudaError_t.cudaSuccess:
        _, name = cudart.cudaGetErrorName(err)
        name = name.decode() if isinstance(name, bytes) else str(name)
        raise BackendError(f"CUDA {what() if callable(what) else what} failed: {name}.")
    return values[0] if len(values) == 1 else tuple(values)
