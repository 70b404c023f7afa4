"""Diversity selection for SFT candidates: at most K per prompt, no near-duplicates (docs/recipe.md §1).

Similarity is the Jaccard similarity of word 3-shingle sets, estimated with MinHash, and
near-duplicates across the whole dataset are found with ``datasketch.MinHashLSH``.

Two passes, both greedy in a preference order given by the caller (best candidate first):

1. **Per prompt** (``Deduper.select``): walk the prompt's candidates best first and drop one whose
   estimated similarity to an already kept one is ≥ ``threshold`` (``near_duplicate``); then drop
   those that are near-duplicates of rows kept for *earlier prompts* (``near_duplicate_global``);
   if more than K remain, pick K by farthest-point selection — start from the best, then
   repeatedly take the candidate whose highest similarity to the picked ones is lowest — and drop
   the rest (``over_k``). Groups are small (N candidates), so this uses the exact signature
   comparison, no index.
2. **Global**: every kept row goes into one LSH index keyed by row id, with the signature of
   prompt ∪ response, so two samples are duplicates only if prompt *and* answer nearly match (a
   long shared answer to two different short prompts is a duplicate; "Answer: 42" to two different
   questions is not). MinHash of a union is the element-wise min of the two signatures, so the
   prompt is hashed once per prompt, not once per candidate. LSH candidates are confirmed with the
   signature estimate before a row is dropped.

The pass is streaming: a row is checked against every row kept before it, so the output never holds
a near-duplicate pair (up to LSH misses) and curation can resume by re-indexing the rows already
written. Cost is linear in the number of candidates.

MinHash, vectorised. ``datasketch.MinHash.update_batch`` hashes every shingle with SHA-1 in Python
and permutes one set at a time. Here a text is normalized as bytes, every word's hash (a polynomial
of its bytes mod 2^64) comes out of one prefix sum over the whole text, a shingle's hash is a
polynomial of its word hashes, and the permutation and min run for a batch of texts at once
(``np.minimum.reduceat`` over the concatenated shingles): no Python-level work per word. The
permutation step is datasketch's own "affine32" scheme with datasketch's parameters, so a signature
here equals ``MinHash(scheme="affine32", hashfunc=<our shingle hash>)`` fed the same shingles
(tested). The LSH index is ``datasketch.MinHashLSH``; it is handed a light object with the
signature as ``hashvalues`` (building a full ``MinHash`` per lookup cost ~0.1 ms, more than the
lookup). The hashes are deterministic (not Python's salted ``hash``), so decisions are identical
across runs, which resume and refresh rely on.
bench/curation_throughput.py measures this against ``MinHash.bulk``.
"""

from __future__ import annotations

import string
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Hashable, Sequence

import numpy as np

from posttrain.configs.curate import DedupConfig

if TYPE_CHECKING:
    from datasketch import MinHash

# datasketch is imported where it is used: importing it costs ~1.4 s (it pulls in its async/redis
# layers).

NEAR_DUPLICATE = "near_duplicate"
NEAR_DUPLICATE_GLOBAL = "near_duplicate_global"
OVER_K = "over_k"

SCHEME = "affine32"
_P = 0x100000001B3  # FNV-64 prime: words and shingles hash as polynomials in it (mod 2^64)
_MUL = np.uint64(_P)
_MASK64 = (1 << 64) - 1
_EMPTY_SHINGLE = np.array([0x9E3779B9], dtype=np.uint32)  # every text hashes at least one shingle
_FMIX32 = (np.uint32(16), np.uint32(0x85EBCA6B), np.uint32(13), np.uint32(0xC2B2AE35), np.uint32(16))


def _normalizing_table() -> bytes:
    table = bytearray(range(256))
    for c in string.punctuation.replace("_", ""):
        table[ord(c)] = ord(" ")
    for c in string.ascii_uppercase:
        table[ord(c)] = ord(c.lower())
    return bytes(table)


_NORMALIZE = _normalizing_table()
_IS_SPACE = np.zeros(256, dtype=bool)
_IS_SPACE[list(b" \t\n\r\x0b\x0c")] = True  # exactly what bytes.split() splits on


def normalize(text: str) -> bytes:
    """UTF-8, ASCII lower-cased, ASCII punctuation turned into spaces, so punctuation, case and
    spacing differences do not make two texts different. A 256-entry bytes table is ~3x faster
    than a regex over str."""
    return text.encode("utf-8").translate(_NORMALIZE)


def words_of(text: str) -> list[bytes]:
    return normalize(text).split()


def word_hash(word: bytes) -> int:
    """Pure-Python reference of a word's hash: sum of byte_j * P^j mod 2^64."""
    x, p = 0, 1
    for b in word:
        x = (x + b * p) & _MASK64
        p = (p * _P) & _MASK64
    return x


def shingle_hash32(words: Sequence[bytes]) -> int:
    """Pure-Python reference of one shingle's hash (what ``MinHasher`` computes in numpy)."""
    x = 0
    for w in words:
        x = (x * _P + word_hash(w)) & _MASK64
    return ((x >> 32) ^ x) & 0xFFFFFFFF


class _Powers:
    """P^j and P^-j mod 2^64 (P odd, so it has an inverse), grown on demand."""

    def __init__(self) -> None:
        self.pow = self.inv = np.empty(0, dtype=np.uint64)
        self._grow(1 << 14)

    def _grow(self, n: int) -> None:
        def table(base: int) -> np.ndarray:
            t = np.full(n, base, dtype=np.uint64)
            t[0] = 1
            return np.cumprod(t, dtype=np.uint64)  # wraps mod 2^64, as intended

        self.pow, self.inv = table(_P), table(pow(_P, -1, 1 << 64))

    def upto(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        if n > len(self.pow):
            self._grow(1 << (n - 1).bit_length())
        return self.pow[:n], self.inv[:n]


_POWERS = _Powers()


def word_hashes(buf: bytes) -> np.ndarray:
    """uint64 hash of every word of a normalized text, all at once: with prefix sums
    H[i] = sum_{j<i} b_j P^j, a word [s, e) hashes to (H[e] - H[s]) * P^-s = sum b_{s+j} P^j."""
    b = np.frombuffer(buf, dtype=np.uint8)
    if len(b) == 0:
        return np.empty(0, dtype=np.uint64)
    space = _IS_SPACE[b]
    edge = np.concatenate(([True], space, [True]))
    starts = np.flatnonzero(edge[:-2] & ~space)
    ends = np.flatnonzero(~space & edge[2:]) + 1
    pw, inv = _POWERS.upto(len(b))
    prefix = np.concatenate((np.zeros(1, dtype=np.uint64), np.cumsum(b * pw, dtype=np.uint64)))
    return (prefix[ends] - prefix[starts]) * inv[starts]


def _fmix32(h: np.ndarray) -> np.ndarray:
    s1, m1, s2, m2, s3 = _FMIX32
    h = h ^ (h >> s1)
    h = h * m1
    h = h ^ (h >> s2)
    h = h * m2
    return h ^ (h >> s3)


def jaccard_estimate(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.count_nonzero(a == b)) / len(a)


class MinHasher:
    """Batched MinHash signatures of texts, compatible with ``datasketch.MinHash`` (affine32)."""

    def __init__(self, num_perm: int = 128, shingle_size: int = 3, seed: int = 1, chunk_shingles: int = 1 << 16) -> None:
        self.num_perm = num_perm
        self.shingle_size = shingle_size
        self.seed = seed
        self.chunk_shingles = chunk_shingles  # bounds the (shingles × perms) temporary to ~32 MB
        from datasketch import MinHash

        self.permutations = MinHash(num_perm=num_perm, seed=seed, scheme=SCHEME).permutations
        self._a, self._b = self.permutations[0], self.permutations[1]

    def shingle_hashes(self, text: str) -> np.ndarray:
        """uint32 hash of every word shingle of ``text`` (one shingle if shorter than the size)."""
        h = word_hashes(normalize(text))
        if len(h) == 0:
            return _EMPTY_SHINGLE
        k = min(self.shingle_size, len(h))
        m = len(h) - k + 1
        x = h[:m].copy()
        for j in range(1, k):
            x *= _MUL
            x += h[j:j + m]
        return ((x >> np.uint64(32)) ^ x).astype(np.uint32)

    def signatures(self, texts: Sequence[str]) -> np.ndarray:
        """MinHash signatures, shape (len(texts), num_perm), uint32."""
        sigs_NP = np.empty((len(texts), self.num_perm), dtype=np.uint32)
        batch: list[np.ndarray] = []
        first, size = 0, 0
        for i, t in enumerate(texts):
            sh = self.shingle_hashes(t)
            batch.append(sh)
            size += len(sh)
            if size >= self.chunk_shingles or i == len(texts) - 1:
                sigs_NP[first:i + 1] = self._minhash_batch(batch)
                batch, first, size = [], i + 1, 0
        return sigs_NP

    def _minhash_batch(self, shingles: list[np.ndarray]) -> np.ndarray:
        lengths = np.fromiter((len(s) for s in shingles), dtype=np.int64, count=len(shingles))
        starts = np.concatenate(([0], np.cumsum(lengths)[:-1]))
        hv_S = _fmix32(np.concatenate(shingles))
        # (perms × shingles) so each segment min runs over contiguous memory; uint32 wraps = mod 2^32
        phv_PS = self._a[:, None] * hv_S[None, :] + self._b[:, None]
        return np.minimum.reduceat(phv_PS, starts, axis=1).T

    def minhash(self, sig_P: np.ndarray) -> "MinHash":
        """A ``datasketch.MinHash`` holding a signature (shares the permutation array)."""
        from datasketch import MinHash

        return MinHash(num_perm=self.num_perm, seed=self.seed, hashvalues=sig_P,
                       permutations=self.permutations, scheme=SCHEME)


@dataclass
class _Sketch:
    """What ``MinHashLSH`` reads from a MinHash: ``hashvalues``, ``scheme`` and ``len``."""

    hashvalues: np.ndarray
    scheme: str = SCHEME

    def __len__(self) -> int:
        return len(self.hashvalues)


class NearDupIndex:
    """LSH over kept rows; ``find`` returns the key of a confirmed near-duplicate or None."""

    def __init__(self, hasher: MinHasher, threshold: float) -> None:
        self.hasher = hasher
        self.threshold = threshold
        from datasketch import MinHashLSH

        self.lsh = MinHashLSH(threshold=threshold, num_perm=hasher.num_perm)
        self._sigs: dict[Hashable, np.ndarray] = {}

    def __len__(self) -> int:
        return len(self._sigs)

    def find(self, sig_P: np.ndarray) -> Hashable | None:
        if not self._sigs:
            return None
        for key in self.lsh.query(_Sketch(sig_P)):
            if jaccard_estimate(self._sigs[key], sig_P) >= self.threshold:
                return key
        return None

    def add(self, key: Hashable, sig_P: np.ndarray) -> None:
        self.lsh.insert(key, _Sketch(sig_P), check_duplication=False)
        self._sigs[key] = sig_P


def similarity_matrix(sigs_GP: np.ndarray) -> np.ndarray:
    """Estimated Jaccard between every pair of signatures, shape (G, G)."""
    return (sigs_GP[:, None, :] == sigs_GP[None, :, :]).mean(axis=-1)


def drop_near_duplicates(sim_GG: np.ndarray, order: Sequence[int], threshold: float) -> tuple[list[int], dict[int, str]]:
    """Greedy in preference order: keep a candidate unless it is ≥ threshold to one already kept."""
    kept: list[int] = []
    dropped: dict[int, str] = {}
    for i in order:
        if kept and sim_GG[i, kept].max() >= threshold:
            dropped[i] = NEAR_DUPLICATE
        else:
            kept.append(i)
    return kept, dropped


def farthest_point(sim_GG: np.ndarray, candidates: Sequence[int], k: int) -> list[int]:
    """Pick k of ``candidates`` (best first): the best, then each time the one least similar to the
    picked set (ties go to the earlier = better candidate)."""
    candidates = list(candidates)
    if len(candidates) <= k:
        return candidates
    picked = [candidates[0]]
    rest = candidates[1:]
    closest = sim_GG[rest, candidates[0]].copy()  # each remaining candidate's max similarity to picked
    while len(picked) < k:
        j = int(np.argmin(closest))  # argmin returns the first minimum → preference order breaks ties
        picked.append(rest[j])
        closest = np.maximum(closest, sim_GG[rest, rest[j]])
        closest[j] = np.inf
    return picked


@dataclass
class Selection:
    kept: list[int]  # indices into the group, in preference order
    dropped: dict[int, str] = field(default_factory=dict)  # index → reason


class Deduper:
    """Streaming per-prompt selection plus the global near-duplicate index (see module docstring)."""

    def __init__(self, cfg: DedupConfig | None = None) -> None:
        self.cfg = cfg or DedupConfig()
        self.hasher = MinHasher(self.cfg.num_perm, self.cfg.shingle_size, self.cfg.seed)
        self.index = NearDupIndex(self.hasher, self.cfg.global_threshold)

    def global_signature(self, prompt_sig_P: np.ndarray, response_sig_P: np.ndarray) -> np.ndarray:
        return np.minimum(prompt_sig_P, response_sig_P)  # MinHash(A ∪ B) = min(MinHash(A), MinHash(B))

    def add_existing(self, keys: Sequence[Hashable], prompt_texts: Sequence[str], response_texts: Sequence[str]) -> None:
        """Index rows kept earlier (resume / refresh) so new rows are checked against them."""
        if not self.cfg.global_dedup or not keys:
            return
        sigs = self.global_signature(self.hasher.signatures(prompt_texts), self.hasher.signatures(response_texts))
        for key, sig in zip(keys, sigs):
            self.index.add(key, sig)

    def select(
        self,
        keys: Sequence[Hashable],
        prompt_text: str,
        response_texts: Sequence[str],
        order: Sequence[int],
        k: int,
    ) -> Selection:
        """Choose ≤ k of one prompt's candidates; the chosen go into the global index under ``keys``."""
        if not response_texts:
            return Selection([])
        sigs_GP = self.hasher.signatures(response_texts)
        sim_GG = similarity_matrix(sigs_GP)
        kept, dropped = drop_near_duplicates(sim_GG, order, self.cfg.threshold)
        global_GP = None
        if self.cfg.global_dedup:
            global_GP = self.global_signature(self.hasher.signatures([prompt_text])[0], sigs_GP)
            unique = []
            for i in kept:
                if self.index.find(global_GP[i]) is None:
                    unique.append(i)
                else:
                    dropped[i] = NEAR_DUPLICATE_GLOBAL
            kept = unique
        picked = farthest_point(sim_GG, kept, k)
        for i in kept:
            if i not in picked:
                dropped[i] = OVER_K
        if global_GP is not None:
            for i in picked:
                self.index.add(keys[i], global_GP[i])
        return Selection(picked, dropped)


def dedup(
    prompt_ids: Sequence[str],
    prompt_texts: Sequence[str],
    response_texts: Sequence[str],
    scores: Sequence[float],
    k: int,
    cfg: DedupConfig | None = None,
) -> Selection:
    """Batch form over a flat list of candidates (for benchmarks and one-shot use): groups by prompt
    in first-seen order, prefers higher scores (then earlier candidates), returns global indices."""
    groups: dict[str, list[int]] = {}
    for i, pid in enumerate(prompt_ids):
        groups.setdefault(pid, []).append(i)
    deduper = Deduper(cfg)
    out = Selection([])
    for pid, idx in groups.items():
        order = sorted(range(len(idx)), key=lambda j: -scores[idx[j]])
        sel = deduper.select([f"{pid}#{j}" for j in range(len(idx))], prompt_texts[idx[0]],
                             [response_texts[i] for i in idx], order, k)
        out.kept.extend(idx[j] for j in sel.kept)
        out.dropped.update({idx[j]: r for j, r in sel.dropped.items()})
    return out
