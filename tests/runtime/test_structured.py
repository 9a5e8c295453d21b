"""Structured outputs (runtime/round/grammar.py): a response_format's grammar masks the draft's
proposals and the target's verification alike, so the constrained speculative output is the
constrained target alone's (greedy: the same tokens; seeded sampling: the same tokens under the
invariant coupling), and it parses and follows the schema."""
from __future__ import annotations

import json

import numpy as np
import pytest
from test_sampling import chi_square_p

pytest.importorskip("llguidance", reason="structured outputs need llguidance")

from ssd_runtime import ConfigError, Generator  # noqa: E402

PROMPTS = ([0, 17, 42, 99, 17, 42], [3, 9, 4], "def read(path):")
SCHEMA = {"type": "object", "additionalProperties": False, "required": ["ok", "color", "n"],
          "properties": {"ok": {"type": "boolean"},
                         "color": {"enum": ["red", "green", "blue"]},
                         "n": {"type": "integer", "minimum": 0, "maximum": 99}}}
FORMAT = {"type": "json_schema", "json_schema": {"name": "thing", "schema": SCHEMA,
                                                 "strict": True}}


@pytest.fixture(scope="module")
def gen(bundle_factory):
    return Generator.load(bundle_factory("llama", "llama_cut"), max_batch=4, threads=1)


def _valid(text: str) -> None:
    value = json.loads(text)
    assert set(value) == {"ok", "color", "n"}
    assert isinstance(value["ok"], bool) and value["color"] in ("red", "green", "blue")
    assert isinstance(value["n"], int) and 0 <= value["n"] <= 99


@pytest.mark.parametrize("setting", [{}, {"temperature": 0.9, "seed": 5}])
def test_constrained_speculation_is_the_constrained_target_alone(gen, setting):
    for prompt in PROMPTS:
        alone = gen.generate(prompt, max_new_tokens=60, k=0, response_format=FORMAT, **setting)
        assert alone.stop_reason == "eos", alone
        _valid(alone.text)
        for k in (4, "auto"):
            res = gen.generate(prompt, max_new_tokens=60, k=k, response_format=FORMAT,
                               **setting)
            assert res.token_ids == alone.token_ids, (prompt, k)
        seeds = [dict(setting, seed=s) for s in range(4)] if setting else []
        for other in seeds:                       # more sampled answers: all valid
            _valid(gen.generate(prompt, max_new_tokens=60, k=4, response_format=FORMAT,
                                **other).text)


def test_json_object_and_text(gen):
    res = gen.generate(PROMPTS[1], max_new_tokens=120, k=4,
                       response_format={"type": "json_object"})
    if res.stop_reason == "eos":                  # a random model may run out of tokens
        assert isinstance(json.loads(res.text), dict)
    else:
        assert res.text.startswith("{")
    plain = gen.generate(PROMPTS[1], max_new_tokens=20, k=0)
    assert gen.generate(PROMPTS[1], max_new_tokens=20, k=4,
                        response_format={"type": "text"}).token_ids == plain.token_ids


def test_a_batch_constrains_each_sequence_its_own_way(gen):
    alone = [gen.generate(p, max_new_tokens=60, k=0, response_format=FORMAT).token_ids
             for p in PROMPTS]
    free = gen.generate(PROMPTS[0], max_new_tokens=30, k=0).token_ids
    results = gen.generate_batch([{"prompt": p, "response_format": FORMAT} for p in PROMPTS]
                                 + [PROMPTS[0]], max_new_tokens=60, k=4)
    assert [r.token_ids for r in results[:3]] == alone
    assert results[3].token_ids[:30] == free


@pytest.mark.parametrize("fmt,match", [
    ({"type": "xml"}, "response_format must be"),
    ("json", "response_format must be"),
    ({"type": "json_schema"}, "response_format.json_schema must be"),
    ({"type": "json_schema", "json_schema": {"name": "a", "schema": []}}, "schema must be"),
    ({"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "nonsense"}}},
     "response_format: json_schema 'a' cannot be used"),
])
def test_bad_formats_name_the_field(gen, fmt, match):
    with pytest.raises(ConfigError, match=match):
        gen.generate(PROMPTS[0], max_new_tokens=4, response_format=fmt)


def test_settings_a_grammar_cannot_honour_are_refused(gen):
    with pytest.raises(ConfigError, match="mode='split'"):
        gen.generate(PROMPTS[0], max_new_tokens=4, response_format=FORMAT, mode="split")
    with pytest.raises(ConfigError, match="ignore_eos"):
        gen.generate(PROMPTS[0], max_new_tokens=4, response_format=FORMAT, ignore_eos=True)
    with pytest.raises(ConfigError, match="min_new_tokens"):
        gen.generate(PROMPTS[0], max_new_tokens=4, response_format=FORMAT, min_new_tokens=3)


INTEGER = {"type": "json_schema", "json_schema": {"name": "n", "schema": {"type": "integer"}}}
SAMPLES = 3000


def _masked(logits: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    scores = np.where(allowed, np.asarray(logits, np.float64), -np.inf)
    p = np.exp(scores - scores.max())
    return p / p.sum()


@pytest.mark.slow
@pytest.mark.parametrize("k", [2, "auto"])
def test_constrained_rejection_sampling_draws_the_masked_target(gen, k):
    """The rejection rule under a grammar: the first two tokens follow the target's masked,
    renormalised distribution, enumerated here from the target's own logits and llguidance's
    masks (chi-square over SAMPLES seeded runs)."""
    prompt = PROMPTS[1]
    constraint = gen.constraint(INTEGER)
    vocab = gen.manifest.target.vocab_size
    ref = constraint.matcher()
    logits = np.asarray(gen.target.forward(np.asarray(prompt, np.int64), 0)[-1])
    p1 = _masked(logits, ref.allowed(vocab))
    second = {}
    for t1 in np.flatnonzero(p1):
        row = np.asarray(gen.target.forward(np.asarray([*prompt, int(t1)], np.int64), 0)[-1])
        second[int(t1)] = _masked(row, ref.allowed(vocab, [int(t1)]))
    eos = sorted(gen.eos_ids)[0]
    joint = {}
    for t1, pt1 in enumerate(p1):
        if pt1 == 0:
            continue
        if t1 == eos:
            joint[t1, -1] = pt1
            continue
        for t2, pt2 in enumerate(second[t1]):
            if pt2 > 0:
                joint[t1, t2] = pt1 * pt2
    samples = []
    for s in range(SAMPLES):
        ids = gen.generate(prompt, max_new_tokens=3, k=k, seed=s, temperature=1.0,
                           coupling="rejection", response_format=constraint).token_ids
        samples.append((ids[0], -1) if ids[0] == eos else (ids[0], ids[1]))
    p = chi_square_p(samples, joint)
    assert p > 1e-3, f"constrained samples do not follow the masked target (p={p:.2g})"


def test_ssd_run_takes_a_schema_and_a_prediction(bundle_factory, tmp_path, capsys):
    from ssd_runtime.cli import main

    bundle = str(bundle_factory("llama", "llama_cut"))
    schema = tmp_path / "thing.json"
    schema.write_text(json.dumps(SCHEMA))
    assert main([bundle, "--prompt", "def f():", "--k", "4", "--json-schema", str(schema),
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    _valid(out["text"])
    prediction = tmp_path / "expected.txt"
    prediction.write_text(out["text"])
    assert main([bundle, "--prompt", "def f():", "--k", "4", "--json-schema", str(schema),
                 "--prediction", str(prediction), "--json"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["text"] == out["text"] and again["stats"]["prediction_drafted"] > 0
    schema.write_text('{"type": "nonsense"}')
    assert main([bundle, "--prompt", "x", "--json-schema", str(schema)]) == 2
    assert "response_format" in capsys.readouterr().err
    schema.write_text(json.dumps(LONG["json_schema"]["schema"]))
    assert main([bundle, "--prompt", "x", "--json-schema", str(schema),
                 "--max-new-tokens", "5"]) == 2
    err = capsys.readouterr().err                 # one line, no traceback
    assert err.count("\n") == 1 and "max_tokens=5" in err and "Traceback" not in err


# Long required names: no valid output is shorter than their text, whatever the values.
LONG_NAMES = [f"{word}_property" for word in ("first", "second", "third", "fourth")]
LONG = {"type": "json_schema", "json_schema": {"name": "long", "schema": {
    "type": "object", "additionalProperties": False, "required": LONG_NAMES,
    "properties": {name: {"type": "boolean"} for name in LONG_NAMES}}}}
# Schemas and a shortest valid text each (the least, by the schema's own rules): the bound must
# never exceed the tokens of that text, which the real matcher accepts whole.
SHORTEST = [
    (SCHEMA, '{"ok":true,"color":"red","n":0}'),
    (LONG["json_schema"]["schema"],
     "{" + ",".join(f'"{name}":true' for name in LONG_NAMES) + "}"),
    ({"type": "object", "required": ["who", "tags"], "properties": {
        "who": {"type": "object", "required": ["first_name", "family_name"], "properties": {
            "first_name": {"type": "string", "minLength": 2},
            "family_name": {"type": "string"}}},
        "tags": {"type": "array", "minItems": 2, "items": {"enum": ["alpha", "beta"]}}}},
     '{"who":{"first_name":"ab","family_name":""},"tags":["beta","beta"]}'),
    ({"$defs": {"pt": {"type": "object", "required": ["x_coordinate", "y_coordinate"],
                       "properties": {"x_coordinate": {"type": "integer"},
                                      "y_coordinate": {"type": "integer"}}}},
      "type": "object", "required": ["corner"],
      "properties": {"corner": {"anyOf": [{"$ref": "#/$defs/pt"}, {"type": "null"}]}}},
     '{"corner":null}'),
    ({"type": "object", "required": ["const_value"],
      "properties": {"const_value": {"const": "a fixed sentence of several words"}}},
     '{"const_value":"a fixed sentence of several words"}'),
    ({"type": "object"}, "{}"),
]


@pytest.mark.parametrize("schema,text", SHORTEST)
def test_the_least_length_is_a_lower_bound(gen, schema, text):
    """The least length a constraint knows is never more than a valid output's tokens (the
    matcher takes the text whole and is then complete), so a max_tokens that holds that output
    is never refused."""
    constraint = gen.constraint({"type": "json_schema",
                                 "json_schema": {"name": "s", "schema": schema}})
    ids = constraint.tokenizer.tokenize_str(text)
    matcher = constraint.matcher().matcher
    assert matcher.consume_tokens(ids) and matcher.is_accepting(), matcher.get_error()
    assert 1 <= constraint.least_tokens <= len(ids)
    gen.request(PROMPTS[0], max_new_tokens=len(ids), response_format=constraint)   # not refused


def test_a_schema_max_tokens_cannot_hold_is_refused(gen):
    constraint = gen.constraint(LONG)
    least = constraint.least_tokens
    assert least > 20, least                          # the long names are counted
    with pytest.raises(ConfigError, match=rf"response_format: no output valid under json_schema "
                       rf"'long' is shorter than {least} tokens .* max_tokens=5 .*raise "
                       rf"max_tokens to at least {least}"):
        gen.generate(PROMPTS[0], max_new_tokens=5, response_format=LONG)
    with pytest.raises(ConfigError, match="max_tokens"):
        gen.request(PROMPTS[0], max_new_tokens=least - 1, response_format=LONG)
    res = gen.generate(PROMPTS[0], max_new_tokens=least + 60, k=4, response_format=LONG)
    assert res.stop_reason == "eos" and len(res.token_ids) >= least
    value = json.loads(res.text)
    assert list(value) == LONG_NAMES and all(isinstance(v, bool) for v in value.values())
    cut = gen.generate(PROMPTS[0], max_new_tokens=least, k=4, response_format=LONG)
    assert cut.stop_reason == "length" and res.text.startswith(cut.text)   # as before: a prefix


def test_a_refused_length_leaves_the_batch_alone(gen):
    alone = [gen.generate(p, max_new_tokens=60, k=0, response_format=FORMAT).token_ids
             for p in PROMPTS[:2]]
    results = gen.generate_batch([{"prompt": PROMPTS[0], "response_format": FORMAT},
                                  {"prompt": PROMPTS[2], "response_format": LONG,
                                   "max_new_tokens": 5},
                                  {"prompt": PROMPTS[1], "response_format": FORMAT}],
                                 max_new_tokens=60, k=4)
    assert [results[0].token_ids, results[2].token_ids] == alone
    assert results[1].stop_reason == "error" and "max_tokens=5" in results[1].error


def test_cover_is_the_least_overlap_over_every_tokenization():
    """TokenPieces.cover against brute force: over every text around `text` (contexts of up to
    two letters each side) and every way of cutting it into tokens, the least number of tokens
    that overlap `text` — the bound is exact here, and never above it."""
    import itertools

    from ssd_runtime.round.schema_length import TokenPieces

    vocab = [b"a", b"b", b"c", b"ab", b"bc", b"cab", b"bca", b"ca"]   # 3 bytes at most
    pieces = TokenPieces.of_bytes(vocab)

    def least_overlap(whole: bytes, start: int, end: int) -> float:
        best = {0: 0}                 # position -> least tokens overlapping [start, end) so far
        for pos in range(len(whole)):
            if pos not in best:
                continue
            for token in vocab:
                if whole.startswith(token, pos):
                    hit = pos < end and pos + len(token) > start
                    best[pos + len(token)] = min(best.get(pos + len(token), 99),
                                                 best[pos] + hit)
        return best.get(len(whole), 99)

    contexts = [bytes(p) for n in range(3) for p in itertools.product(b"abc", repeat=n)]
    for n in range(1, 6):
        for text in map(bytes, itertools.product(b"abc", repeat=n)):
            brute = min(least_overlap(left + text + right, len(left), len(left) + n)
                        for left in contexts for right in contexts)
            assert pieces.cover(text) == brute, text
