"""TextStream: incremental decoding and stop strings against a plain decode."""
from __future__ import annotations

import random

import pytest

from ssd_runtime.manifest import read_manifest
from ssd_runtime.text import TextCodec, TextStream

TEXTS = ["def f(x):\n    return x  # héllo wörld 😀 ünïcode\n",
         "日本語のテキスト, émoji 🎉🎉 and code: print('a')\n" * 3]
STOPS = [[], ["\n"], ["return"], ["🎉"], ["x  #", "zzz"], ["wör"], ["ö"]]


@pytest.fixture(scope="module")
def codec(bundle_factory) -> TextCodec:
    root = bundle_factory("llama", "llama_cut")
    return TextCodec(root, read_manifest(root, verify=False).tokenizer)


def test_pieces_are_the_text_cut_at_the_first_stop(codec):
    """Ids pushed in random chunks (multi-byte characters split across tokens, and random
    ids that decode to broken UTF-8) give exactly the decoded text up to the first stop
    string, and never any part of a stop string."""
    rng = random.Random(0)
    for trial in range(300):
        ids = codec.encode(rng.choice(TEXTS))[1:]
        if trial % 3 == 0:
            ids = [rng.randrange(3, 200) for _ in range(60)]
        stops = rng.choice(STOPS)
        stream, pieces, i = TextStream(codec, stops), [], 0
        while i < len(ids) and not stream.stopped:
            n = rng.randint(1, 5)
            pieces.append(stream.push(ids[i:i + n]))
            i += n
        pieces.append(stream.flush())
        full = codec.decode(ids[:i])
        cuts = [full.find(s) for s in stops if s in full]
        want = full[:min(cuts)] if cuts else full
        assert "".join(pieces) == stream.text == want, (trial, stops)
        assert stream.stopped == bool(cuts)
        if cuts:
            assert codec.decode(stream.ids) == want[:len(codec.decode(stream.ids))]


def test_text_that_is_not_unicode_is_a_config_error(codec):
    """A lone surrogate (bytes decoded with surrogateescape, as a shell's invalid UTF-8
    reaches sys.argv): named, not the tokenizer's TypeError."""
    from ssd_runtime import ConfigError

    for text in ("a\ud800b", "ab\udcffcd"):
        with pytest.raises(ConfigError, match=r"not valid Unicode: surrogates not allowed at "
                                              r"character \d"):
            codec.encode(text)
    assert codec.encode("a\u00e9b") == codec.encode("aéb")
