"""MinHash/LSH near-duplicate removal and diversity selection."""

from __future__ import annotations

import random

import numpy as np
import pytest
from datasketch import MinHash, MinHashLSH

from posttrain.configs.curate import DedupConfig
from posttrain.data.dedup import (
    NEAR_DUPLICATE,
    NEAR_DUPLICATE_GLOBAL,
    OVER_K,
    Deduper,
    MinHasher,
    NearDupIndex,
    dedup,
    drop_near_duplicates,
    farthest_point,
    jaccard_estimate,
    shingle_hash32,
    similarity_matrix,
    word_hash,
    word_hashes,
    words_of,
)

VOCAB = [f"w{i}" for i in range(3000)]


def random_text(rng: random.Random, n: int = 80) -> str:
    return " ".join(rng.choice(VOCAB) for _ in range(n))


def edit(text: str, rng: random.Random, n_changes: int) -> str:
    words = text.split()
    for _ in range(n_changes):
        words[rng.randrange(len(words))] = rng.choice(VOCAB)
    return " ".join(words)


def shingle_set(text: str, k: int = 3) -> set:
    w = words_of(text)
    return {tuple(w[i:i + k]) for i in range(len(w) - k + 1)}


def test_words_ignore_case_punctuation_and_spacing():
    assert words_of("Hello,  World!\n(ok)") == words_of("hello world ok") == [b"hello", b"world", b"ok"]
    assert words_of("snake_case stays") == [b"snake_case", b"stays"]
    assert words_of("") == []


def test_vectorised_word_hashes_equal_the_reference_for_any_spacing():
    for text in ["alpha beta  gamma", "  lead and trail  ", "x", "", "tabs\tand\nnew\r\nlines", "ünïcödé wörds ok"]:
        buf = text.encode("utf-8")
        assert word_hashes(buf).tolist() == [word_hash(w) for w in buf.split()]
    long = ("word " * 20000).encode()  # longer than the initial power table
    assert len(word_hashes(long)) == 20000 and len(set(word_hashes(long).tolist())) == 1
    assert word_hash(b"ab") != word_hash(b"ba")


def test_signatures_equal_datasketch_affine32_minhash_on_the_same_shingle_hashes():
    text = "The quick brown fox jumps over the lazy dog, then the fox naps in the sun."
    hasher = MinHasher(num_perm=64, shingle_size=3, seed=7)
    w = words_of(text)
    reference = [shingle_hash32(w[i:i + 3]) for i in range(len(w) - 2)]
    assert hasher.shingle_hashes(text).tolist() == reference  # numpy == pure-Python shingle hash
    m = MinHash(num_perm=64, seed=7, scheme="affine32", hashfunc=lambda v: v)
    m.update_batch(reference)
    assert np.array_equal(hasher.signatures([text])[0], m.hashvalues)
    wrapped = hasher.minhash(hasher.signatures([text])[0])
    assert wrapped.jaccard(m) == 1.0


def test_batched_signatures_match_one_at_a_time_across_chunk_boundaries():
    rng = random.Random(0)
    texts = [random_text(rng, rng.randint(0, 50)) for _ in range(30)] + ["", "one", "two words"]
    small_chunks = MinHasher(num_perm=32, chunk_shingles=40)
    batched = small_chunks.signatures(texts)
    singles = np.stack([MinHasher(num_perm=32).signatures([t])[0] for t in texts])
    assert batched.shape == (33, 32) and batched.dtype == np.uint32
    assert np.array_equal(batched, singles)


def test_estimate_tracks_true_jaccard_and_orders_similarity():
    rng = random.Random(1)
    hasher = MinHasher(num_perm=256)
    base = random_text(rng, 120)
    near, far = edit(base, rng, 3), random_text(rng, 120)
    s = hasher.signatures([base, near, far])
    a, b = shingle_set(base), shingle_set(near)
    assert jaccard_estimate(s[0], s[1]) == pytest.approx(len(a & b) / len(a | b), abs=0.08)
    assert jaccard_estimate(s[0], s[0]) == 1.0
    assert jaccard_estimate(s[0], s[2]) < 0.1
    assert jaccard_estimate(s[0], s[1]) > 0.75


def test_drop_near_duplicates_is_greedy_in_preference_order():
    sim = np.array([[1.0, 0.9, 0.1], [0.9, 1.0, 0.2], [0.1, 0.2, 1.0]])
    assert drop_near_duplicates(sim, [0, 1, 2], 0.8) == ([0, 2], {1: NEAR_DUPLICATE})
    assert drop_near_duplicates(sim, [1, 0, 2], 0.8) == ([1, 2], {0: NEAR_DUPLICATE})
    assert drop_near_duplicates(sim, [0, 1, 2], 0.95) == ([0, 1, 2], {})


def test_farthest_point_picks_the_best_then_the_least_similar():
    sim = np.array([
        [1.0, 0.7, 0.1, 0.5],
        [0.7, 1.0, 0.2, 0.4],
        [0.1, 0.2, 1.0, 0.3],
        [0.5, 0.4, 0.3, 1.0],
    ])
    assert farthest_point(sim, [0, 1, 2, 3], 1) == [0]
    assert farthest_point(sim, [0, 1, 2, 3], 2) == [0, 2]
    # after 0 and 2: candidate 1 is within 0.7 of the picked, candidate 3 within 0.5 → 3
    assert farthest_point(sim, [0, 1, 2, 3], 3) == [0, 2, 3]
    assert farthest_point(sim, [3, 1], 5) == [3, 1]
    ties = np.eye(3)  # all equally different: preference order decides
    assert farthest_point(ties, [2, 0, 1], 2) == [2, 0]


def test_near_dup_index_is_a_datasketch_lsh_with_confirmed_matches():
    rng = random.Random(2)
    hasher = MinHasher()
    base = random_text(rng, 100)
    sigs = hasher.signatures([base, edit(base, rng, 1), random_text(rng, 100)])
    index = NearDupIndex(hasher, threshold=0.8)
    assert isinstance(index.lsh, MinHashLSH) and index.find(sigs[0]) is None
    index.add("a", sigs[0])
    assert index.find(sigs[1]) == "a"
    assert index.find(sigs[2]) is None
    assert len(index) == 1


def test_select_within_a_prompt_drops_near_duplicates_then_keeps_k_diverse():
    rng = random.Random(3)
    a, c, d = random_text(rng), random_text(rng), random_text(rng)
    responses = [a, edit(a, rng, 1), c, edit(c, rng, 1), d]
    dd = Deduper(DedupConfig())
    sel = dd.select([f"p#{i}" for i in range(5)], "prompt text", responses, order=[0, 1, 2, 3, 4], k=2)
    assert sel.kept[0] == 0 and len(sel.kept) == 2
    assert sel.dropped[1] == NEAR_DUPLICATE and sel.dropped[3] == NEAR_DUPLICATE
    assert sorted(r for r in sel.dropped.values()) == [NEAR_DUPLICATE, NEAR_DUPLICATE, OVER_K]
    assert len(dd.index) == 2  # only the kept rows are indexed


def test_global_pass_compares_prompt_and_answer_together():
    rng = random.Random(4)
    long_answer = random_text(rng, 150)
    dd = Deduper(DedupConfig())
    dd.select(["p1#0"], "What is the capital of France?", [long_answer], [0], k=2)
    # a different short prompt with the same long answer: the sample is a duplicate
    sel = dd.select(["p2#0"], "Capital of France?", [long_answer], [0], k=2)
    assert sel.kept == [] and sel.dropped == {0: NEAR_DUPLICATE_GLOBAL}
    # the same short answer to different long questions is not
    dd2 = Deduper(DedupConfig())
    dd2.select(["q1#0"], random_text(rng, 100), ["Answer: 42"], [0], k=1)
    assert dd2.select(["q2#0"], random_text(rng, 100), ["Answer: 42"], [0], k=1).kept == [0]
    # turned off, nothing is compared across prompts
    dd3 = Deduper(DedupConfig(global_dedup=False))
    dd3.select(["p1#0"], "same", [long_answer], [0], k=1)
    assert dd3.select(["p2#0"], "same", [long_answer], [0], k=1).kept == [0]


def test_existing_rows_seed_the_global_index():
    rng = random.Random(5)
    prompt, answer = random_text(rng, 30), random_text(rng, 100)
    dd = Deduper()
    dd.add_existing(["old#0"], [prompt], [answer])
    sel = dd.select(["new#0"], prompt, [edit(answer, rng, 1)], [0], k=1)
    assert sel.dropped == {0: NEAR_DUPLICATE_GLOBAL}


def test_similarity_matrix_is_symmetric_with_unit_diagonal():
    sigs = MinHasher(num_perm=32).signatures(["a b c d", "a b c e", "x y z"])
    sim = similarity_matrix(sigs)
    assert np.allclose(sim, sim.T) and np.allclose(np.diag(sim), 1.0)


def test_batch_dedup_groups_by_prompt_prefers_scores_and_returns_global_indices():
    rng = random.Random(6)
    a, b = random_text(rng), random_text(rng)
    prompts = ["p1", "p1", "p1", "p2", "p2"]
    ptexts = ["question one"] * 3 + ["question two"] * 2
    responses = [a, edit(a, rng, 1), b, random_text(rng), random_text(rng)]
    scores = [0.5, 1.0, 1.0, 1.0, 1.0]
    sel = dedup(prompts, ptexts, responses, scores, k=1)
    assert sorted(sel.kept) == [1, 3]  # p1: the better-scored near-copy of a wins
    assert sel.dropped == {0: NEAR_DUPLICATE, 2: OVER_K, 4: OVER_K}
