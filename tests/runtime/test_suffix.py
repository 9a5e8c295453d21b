"""Drafts from earlier requests (runtime/round/suffix.py, docs/design.md §6.1): the suffix index
drafts the continuation earlier requests most often went on with, per tenant, within its
budget, and every output stays exactly the target's."""
from __future__ import annotations

import random

import pytest

from ssd_runtime import ConfigError, Generator
from ssd_runtime.round.lookup import SUFFIX_LONG, SUFFIX_SHORT, Lookup
from ssd_runtime.round.suffix import MIN_PROB, SuffixStore


def test_the_most_frequent_continuation_of_the_longest_match_is_drafted():
    store = SuffixStore()
    store.add(None, [1, 2, 3, 4, 5, 6, 7, 8, 9])
    store.add(None, [1, 2, 3, 4, 5, 6, 7, 10, 11])
    store.add(None, [5, 2, 3, 4, 5, 6, 7, 8, 9])
    # [.., 3, 4, 5] matches three places 3 tokens deep: depth = the match's length
    assert store.find(None, [0, 3, 4, 5], 8) == ([6, 7, 8], 3)
    # [1, 2, 3, 4, 5] matches the first two 5 deep: they part after 7, one each: 6, 7, then a
    # coin toss is still above MIN_PROB, and the latest of the two wins
    assert MIN_PROB < 0.5
    assert store.find(None, [1, 2, 3, 4, 5], 8) == ([6, 7, 10, 11], 5)
    assert store.find(None, [9, 9], 8) == ([], 0)            # never seen
    assert store.find(None, [6, 7], 0) == ([], 0)             # nothing asked
    assert store.find(None, [8], 4) == ([], 0)                # shorter than the anchor


def test_a_continuation_split_many_ways_is_not_drafted_past_the_split():
    store = SuffixStore()
    for tail in range(20):                                  # 20 requests part after [4, 5, 6]
        store.add(None, [4, 5, 6, 100 + tail, 7])
    assert store.find(None, [4, 5, 6], 3) == ([], 0)         # 1/20 < MIN_PROB
    for _ in range(3):                                      # ... 3 of 23 go on with 200, 201
        store.add(None, [4, 5, 6, 200, 201])
    assert store.find(None, [4, 5, 6], 3) == ([200, 201], 3)


def test_tenants_draft_only_their_own_text_and_clear_forgets_it():
    store = SuffixStore()
    store.add("alice", [1, 2, 3, 4, 5, 6])
    store.add("bob", [1, 2, 3, 9, 9, 9])
    assert store.find("alice", [1, 2, 3], 3) == ([4, 5, 6], 3)
    assert store.find("bob", [1, 2, 3], 3) == ([9, 9, 9], 3)
    assert store.find(None, [1, 2, 3], 3) == ([], 0)
    assert store.clear("alice") == 1
    assert store.find("alice", [1, 2, 3], 3) == ([], 0)
    assert store.find("bob", [1, 2, 3], 3) == ([9, 9, 9], 3)
    assert store.clear(everyone=True) == 1 and store.summary()["requests"] == 0


def test_the_store_stays_within_its_budget_oldest_out_first():
    rng = random.Random(0)
    budget = 1 << 20
    store = SuffixStore(budget)
    texts = []
    for i in range(2000):
        tokens = [rng.randrange(3000) for _ in range(rng.randrange(50, 400))]
        texts.append(tokens)
        store.add(f"t{i % 3}", tokens)
        assert store.nbytes <= budget
    summary = store.summary()
    assert summary["evicted"] > 0 and summary["added"] == 2000
    kept = summary["requests"]
    # what is left is the newest requests, and each is still found whole
    for i in range(2000 - kept, 2000):
        tokens = texts[i]
        found, matched = store.find(f"t{i % 3}", tokens[:30], 8)
        assert matched >= 2 and found == tokens[30:30 + len(found)] and found
    # the oldest are gone: their text drafts nothing that is not also in a newer one's
    old = texts[0]
    found, _ = store.find("t0", old[:30], 8)
    assert found != old[30:38] or any(old[:32] == t[:32] for t in texts[-kept:])
    # no budget keeps nothing
    none = SuffixStore(0)
    none.add(None, [1, 2, 3, 4])
    assert none.summary()["requests"] == 0


def test_lookup_offers_earlier_requests_where_they_match_longer():
    store = SuffixStore()
    store.add(None, [10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20])
    look = Lookup(earlier=store.view(None))
    seq = [1, 12, 13, 14, 15, 16, 17, 18, 19]          # 8 deep in the earlier request
    assert look.find(seq, 4) == ([20], SUFFIX_LONG)    # all it went on with
    assert look.source == "earlier"
    look = Lookup(earlier=store.view(None))           # (a Lookup follows one sequence)
    seq = [13, 99, 13, 14]                              # own: [13] then 99; earlier: [13, 14]
    found, cls = look.find(seq, 2)
    assert (found, cls, look.source) == ([15, 16], SUFFIX_SHORT, "earlier")
    # the sequence's own 3-gram outweighs a 3-deep earlier match
    look = Lookup(earlier=store.view(None))
    seq = [12, 13, 14, 77, 12, 13, 14]
    assert look.find(seq, 2) == ([77, 12], 3) and look.source == "sequence"


@pytest.fixture(scope="module")
def gen(bundle_factory):
    return Generator.load(bundle_factory("llama", "llama_cut"), max_batch=4)


PROMPTS = [[0, 17, 42, 99, 3, 8], [0, 5, 6, 7, 8, 9], [3, 1, 4, 1, 5], [0, 17, 42, 99, 3, 8]]


def test_suffix_drafts_from_earlier_requests_and_the_output_is_the_targets(gen):
    gen.suffixes.clear(everyone=True)
    alone = [gen.generate(p, max_new_tokens=40, k=0).token_ids for p in PROMPTS]
    earlier = 0
    for k, source in ((3, "suffix"), (3, "fused+suffix"), ("auto", "fused+suffix"),
                      ("auto", "suffix")):
        gen.suffixes.clear(everyone=True)
        for prompt, want in zip(PROMPTS, alone):
            res = gen.generate(prompt, max_new_tokens=40, k=k, draft_source=source,
                               tenant="a")
            assert res.token_ids == want, (prompt, k, source)
            earlier += res.stats.earlier_drafted
            if source == "suffix":
                assert res.stats.draft_calls == 0
        # the last prompt repeats the first: its output was drafted from it
        assert res.stats.earlier_accepted > 0, (k, source)
    assert earlier > 0
    # another tenant's requests never draft from "a"'s text
    res = gen.generate(PROMPTS[0], max_new_tokens=40, k=3, draft_source="suffix", tenant="b")
    assert res.token_ids == alone[0] and res.stats.earlier_drafted == 0
    # nor does a request of another source, which adds nothing either
    before = gen.suffixes.summary()["requests"]
    res = gen.generate(PROMPTS[0], max_new_tokens=40, k=3, draft_source="fused", tenant="a")
    assert res.stats.earlier_drafted == 0 and gen.suffixes.summary()["requests"] == before


def test_seeded_sampling_and_batches_with_suffix_give_the_target_alones_tokens(gen):
    run = dict(max_new_tokens=24, temperature=0.8, ignore_eos=True)
    for seed in range(3):
        gen.suffixes.clear(everyone=True)
        alone = gen.generate(PROMPTS[0], k=0, seed=seed, **run).token_ids
        for _ in range(2):                               # the second drafts from the first
            res = gen.generate(PROMPTS[0], k="auto", seed=seed, draft_source="fused+suffix",
                               **run)
            assert res.token_ids == alone, seed
    gen.suffixes.clear(everyone=True)
    greedy = [gen.generate(p, max_new_tokens=30, k=0).token_ids for p in PROMPTS]
    for k, source in ((2, "fused+suffix"), ("auto", "fused+suffix"), (2, "suffix")):
        gen.generate_batch(PROMPTS, max_new_tokens=30, k=k, draft_source=source)
        again = gen.generate_batch(PROMPTS, max_new_tokens=30, k=k, draft_source=source)
        assert [r.token_ids for r in again] == greedy, k
        if k == 2:           # (under auto the batch's plan may price drafting out: §11)
            assert sum(r.stats.earlier_drafted for r in again) > 0


def test_a_bad_suffix_budget_is_refused(bundle_factory):
    with pytest.raises(ConfigError, match="suffix_budget=-1 must be a number of bytes"):
        Generator.load(bundle_factory("llama", "llama_cut"), suffix_budget=-1)
