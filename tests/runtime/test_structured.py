"""Structured outputs (runtime/round/grammar.py): a response_format's grammar masks the draft's
proposals and the target's verification alike, so the constrained speculative output is the
constrained target alone's (greedy: the same tokens; seeded sampling: the same tokens under the
invariant coupling), and it parses and follows the schema."""
from __future__ import annotations

import json

import pytest

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
