"""Ragged batches (issue 22): rows with different past lengths and different numbers of new
tokens in one ONNX Runtime call give what each row gives alone, in every graph flavour.

Each row b has a prompt-prefilled cache of p_b rows and n_b real new tokens, padded at the end
to T with dummy tokens at the following positions. The standard flavour is bound as the
runtime binds a batch: every slot's whole cache, P = MAX_CONTEXT past rows, of which rows p_b
and up hold garbage (they must be masked); the ort flavour takes the whole head-major caches,
garbage past p_b too, updated in place; so does the static flavour, whose ScatterND writes
each row's new rows (padding included) at its positions and whose attention masks by position.

ONNX Runtime's GroupQueryAttention (1.32, CPU and CUDA share the check) refuses a batch of
more than one row with T > 1 new tokens after a past ("batch_size must be 1 when
sequence_length > 1 and past context is given"): the ort flavour batches decode steps (T = 1)
and first prompts (every row at past 0), not a ragged verification.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

import tiny
from ssd_graphs.trace import export_decoder
from ssd_runtime import contract

MAX_CONTEXT = 64
# batch -> (each row's past length (its prompt, prefilled alone), each row's real new tokens,
# padded to T = max of them)
BATCHES = {"ragged": ((1, 7, 40), (1, 3, 5)),      # a verification of k+1 = 1, 3, 5 tokens
           "decode": ((1, 7, 40), (1, 1, 1)),      # draft steps
           "prompts": ((0, 0, 0), (1, 3, 5))}      # first prompts of 1, 3, 5 tokens

# name -> (tiny kind, config overrides); ALiBi models have no ort flavour
FAMILIES = {
    "llama": ("llama", {}),
    "mistral": ("mistral", {"sliding_window": 6}),          # shorter than rows 2 and 3
    "qwen2": ("qwen2", {}),
    "gpt2": ("gpt2", {}),                                   # learned absolute positions
    "falcon_alibi": ("falcon", tiny.FALCON_ALIBI),          # ALiBi in bfloat16, scaled
    "bloom": ("bloom", {}),                                 # ALiBi in the model's dtype
}
NO_ORT = {"falcon_alibi", "bloom"}
FLAVOURS = [(name, flavour) for name in FAMILIES for flavour in contract.GRAPHS
            if not (flavour == contract.ORT and name in NO_ORT)]
# GroupQueryAttention takes no batch of T > 1 new tokens after a past
ORT_BATCHES = ("decode", "prompts")
CASES = [(name, flavour, batch) for name, flavour in FLAVOURS for batch in BATCHES
         if flavour != contract.ORT or batch in ORT_BATCHES]


class _Sessions(dict):
    """(name, flavour) -> (graph path, ONNX Runtime session over it), each exported when first
    asked for (the fast subset asks for a few)."""

    def __init__(self, root) -> None:
        super().__init__()
        self.root, self.models = root, {}

    def __missing__(self, key):
        import onnxruntime as ort
        from transformers import AutoModelForCausalLM

        name, flavour = key
        if name not in self.models:
            kind, overrides = FAMILIES[name]
            torch.manual_seed(70 + list(FAMILIES).index(name))
            config = tiny.config_for(kind, tiny.VOCAB, **overrides)
            self.models[name] = AutoModelForCausalLM.from_config(
                config, attn_implementation="eager").eval()
        path = self.root / f"{name}-{flavour}" / "model.onnx"
        export_decoder(self.models[name], name, path, MAX_CONTEXT, graph=flavour)
        self[key] = path, ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        return self[key]


@pytest.fixture(scope="module")
def sessions(tmp_path_factory):
    return _Sessions(tmp_path_factory.mktemp("batch"))


def _layers(session) -> int:
    return len([i for i in session.get_inputs() if i.name.startswith("past_key.")])


def _kv_shape(session) -> tuple[int, int]:
    """(Hkv, D) from the first cache input, in either layout."""
    shape = session.get_inputs()[2].shape
    return (shape[1], shape[3]) if isinstance(shape[1], int) else (shape[2], shape[3])


def _run_standard(session, ids, pos, past):
    """One call of the standard graph: logits (B, T, V) and the new rows (B, T, Hkv, D)."""
    feeds = {contract.INPUT_IDS: ids, contract.POSITION_IDS: pos}
    for i in range(_layers(session)):
        feeds[contract.past_key(i)], feeds[contract.past_value(i)] = past[2 * i], past[2 * i + 1]
    logits, *new = session.run(None, feeds)
    return logits, new


def _run_ort(session, ids, pos, caches):
    """One call of the ort graph with every (B, Hkv, rows, D) cache bound as past and present
    (updated in place, as the runtime runs it); returns the logits."""
    binding = session.io_binding()
    binding.bind_cpu_input(contract.INPUT_IDS, np.ascontiguousarray(ids))
    binding.bind_cpu_input(contract.POSITION_IDS, np.ascontiguousarray(pos))
    binding.bind_output(contract.LOGITS)
    if contract.ATTEND_ROWS in {i.name for i in session.get_inputs()}:   # static: rows [0, L)
        binding.bind_cpu_input(contract.ATTEND_ROWS, np.arange(int(pos.max()) + 1))
    for i in range(_layers(session)):
        for j, (past, present) in enumerate(((contract.past_key(i), contract.present_key(i)),
                                             (contract.past_value(i), contract.present_value(i)))):
            cache = caches[2 * i + j]
            for name, bind in ((past, binding.bind_input), (present, binding.bind_output)):
                bind(name, "cpu", 0, cache.dtype, cache.shape, cache.ctypes.data)
    session.run_with_iobinding(binding)
    return binding.copy_outputs_to_cpu()[0]


def _positions(start: int, n: int) -> np.ndarray:
    return np.arange(start, start + n, dtype=np.int64)[None]


def _alone(session, flavour, ids, past_lens, new_lens):
    """Row by row, each as a batch of one exactly as today's runtime runs it: prefill the
    past, then the real new tokens. Per row: (prefilled past, logits (n, V), new K/V rows
    (n, Hkv, D) per cache)."""
    n_layers, (kv_heads, head_dim) = _layers(session), _kv_shape(session)
    rows = []
    for b, (p, n) in enumerate(zip(past_lens, new_lens)):
        prompt, new = ids[b:b + 1, :p], ids[b:b + 1, p:p + n]
        if contract.in_place(flavour):
            caches = [np.zeros((1, kv_heads, MAX_CONTEXT, head_dim), np.float32)
                      for _ in range(2 * n_layers)]
            if p:
                _run_ort(session, prompt, _positions(0, p), caches)
            prefilled = [c[0, :, :p].copy() for c in caches]                  # (Hkv, p, D)
            logits = _run_ort(session, new, _positions(p, n), caches)
            new_kv = [c[0, :, p:p + n].transpose(1, 0, 2) for c in caches]    # (n, Hkv, D)
        else:
            empty = [np.zeros((1, 0, kv_heads, head_dim), np.float32)] * (2 * n_layers)
            prefilled = _run_standard(session, prompt, _positions(0, p), empty)[1] if p else empty
            logits, new_kv = _run_standard(session, new, _positions(p, n), prefilled)
            prefilled = [x[0] for x in prefilled]                             # (p, Hkv, D)
            new_kv = [x[0] for x in new_kv]
        rows.append((prefilled, logits[0], new_kv))
    return rows


# the fast subset (-m "not slow") keeps every flavour on llama and the static one on mistral
RUNS = [pytest.param(*case, marks=() if case[0] == "llama" or case[:2] == (
            "mistral", contract.STATIC) else pytest.mark.slow) for case in CASES]


@pytest.mark.parametrize("name,flavour,batch", RUNS)
def test_a_ragged_batch_gives_each_row_what_it_gives_alone(sessions, name, flavour, batch):
    _, session = sessions[name, flavour]
    past_lens, new_lens = BATCHES[batch]
    T = max(new_lens)
    rng = np.random.default_rng(len(name))
    n_layers, (kv_heads, head_dim) = _layers(session), _kv_shape(session)
    # each row's prompt and real tokens, then padding: random tokens at the following positions
    ids = rng.integers(3, tiny.VOCAB, size=(len(past_lens), max(past_lens) + T), dtype=np.int64)
    alone = _alone(session, flavour, ids, past_lens, new_lens)

    batch_ids = np.stack([ids[b, p:p + T] for b, p in enumerate(past_lens)])          # (B, T)
    batch_pos = np.stack([np.arange(p, p + T) for p in past_lens]).astype(np.int64)   # (B, T)
    B = len(past_lens)
    if contract.in_place(flavour):      # whole head-major caches, garbage past each row's p_b
        caches = [rng.normal(scale=5.0, size=(B, kv_heads, MAX_CONTEXT, head_dim))
                  .astype(np.float32) for _ in range(2 * n_layers)]
        for b, (prefilled, _, _) in enumerate(alone):
            for cache, rows in zip(caches, prefilled):
                cache[b, :, :past_lens[b]] = rows
        logits = _run_ort(session, batch_ids, batch_pos, caches)
        new_kv = [c.transpose(0, 2, 1, 3) for c in caches]                     # (B, rows, ..)
        new_rows = [[kv[b, past_lens[b]:past_lens[b] + new_lens[b]] for kv in new_kv] for b in range(B)]
        for b in range(B):              # the row's prefilled past is left as it was
            for cache, rows in zip(caches, alone[b][0]):
                np.testing.assert_array_equal(cache[b, :, :past_lens[b]], rows)
    else:                               # each slot's whole cache: P = MAX_CONTEXT past rows
        past = [rng.normal(scale=5.0, size=(B, MAX_CONTEXT, kv_heads, head_dim))
                .astype(np.float32) for _ in range(2 * n_layers)]
        for b, (prefilled, _, _) in enumerate(alone):
            for cache, rows in zip(past, prefilled):
                cache[b, :past_lens[b]] = rows
        logits, new_kv = _run_standard(session, batch_ids, batch_pos, past)
        new_rows = [[kv[b, :new_lens[b]] for kv in new_kv] for b in range(B)]

    for b, (_, ref_logits, ref_kv) in enumerate(alone):
        got = logits[b, :new_lens[b]]
        np.testing.assert_allclose(got, ref_logits, atol=1e-4, rtol=1e-5,
                                   err_msg=f"{name} {flavour} {batch}: row {b} logits")
        assert (got.argmax(-1) == ref_logits.argmax(-1)).all(), (name, flavour, batch, b)
        for i, (ours, ref) in enumerate(zip(new_rows[b], ref_kv)):
            np.testing.assert_allclose(ours, ref, atol=1e-4, rtol=1e-5,
                                       err_msg=f"{name} {flavour} {batch}: row {b} cache {i}")


def test_stale_past_rows_would_change_the_logits_if_seen(sessions):
    """The garbage in the batch test is large enough to matter: the standard graph called as
    before the ragged contract (P == each row's own past length) on a past whose every row is
    garbage gives other logits than on the real past."""
    _, session = sessions["llama", contract.STANDARD]
    rng = np.random.default_rng(0)
    n_layers, (kv_heads, head_dim) = _layers(session), _kv_shape(session)
    ids = rng.integers(3, tiny.VOCAB, size=(1, 4), dtype=np.int64)
    pos = _positions(7, 4)
    zeros = [np.zeros((1, 7, kv_heads, head_dim), np.float32)] * (2 * n_layers)
    garbage = [rng.normal(scale=5.0, size=(1, 7, kv_heads, head_dim)).astype(np.float32)
               for _ in range(2 * n_layers)]
    a, _ = _run_standard(session, ids, pos, zeros)
    b, _ = _run_standard(session, ids, pos, garbage)
    assert np.abs(a - b).max() > 1e-2


def test_group_query_attention_refuses_a_batch_of_several_new_tokens_after_a_past(sessions):
    """Why the ort flavour has no "ragged" case: ONNX Runtime refuses it. If a later ONNX
    Runtime takes it, this fails: add "ragged" to ORT_BATCHES."""
    import onnxruntime as ort

    path, session = sessions["llama", contract.ORT]
    fresh = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    kv_heads, head_dim = _kv_shape(session)
    caches = [np.zeros((2, kv_heads, MAX_CONTEXT, head_dim), np.float32)
              for _ in range(2 * _layers(session))]
    ids = np.full((2, 2), 5, np.int64)
    pos = np.array([[3, 4], [7, 8]], np.int64)
    with pytest.raises(Exception, match=r"batch_size must be 1 when sequence_length > 1 and "
                                        r"past context is given"):
        _run_ort(fresh, ids, pos, caches)


@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_a_static_rows_logits_have_the_same_bits_alone_and_among_k_plus_1(sessions, name):
    """The static flavour's row is a function of itself alone (docs/design.md §12), float32:
    five new tokens in one call give bitwise the logits of one token a call. llama's G = 2
    query heads a KV head are the products' rows; gpt2's G = 1 takes the zero row that keeps
    a product off ONNX Runtime's one-row kernel (attention.row_exact_matmul)."""
    _, session = sessions[name, contract.STATIC]
    n_layers, (kv_heads, head_dim) = _layers(session), _kv_shape(session)
    ids = np.random.default_rng(44).integers(3, tiny.VOCAB, size=(1, 14))
    caches = [np.zeros((1, kv_heads, MAX_CONTEXT, head_dim), np.float32)
              for _ in range(2 * n_layers)]
    _run_ort(session, ids[:, :9], _positions(0, 9), caches)
    together = _run_ort(session, ids[:, 9:], _positions(9, 5), [c.copy() for c in caches])[0]
    alone = np.stack([_run_ort(session, ids[:, t:t + 1], _positions(t, 1), caches)[0, 0]
                      for t in range(9, 14)])                               # (5, V)
    assert (together == alone).all(), f"rows differ by {np.abs(together - alone).max(1)}"
