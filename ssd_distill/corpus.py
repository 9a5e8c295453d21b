"""The cached answers as training rows (docs/distill.md §9): `Corpus` serves batches of `Rows`
(ids, labels, features) read from the answer cache, features from disk a batch at a time, so
that memory holds the ids and labels (about 130 bytes a position) and not the features
(3·H·2 bytes a position: 3.4 KB for SmolLM2-135M).

Also the draft vocabulary: the tokens the target writes most often in its answers.
"""
from __future__ import annotations

import numpy as np
import torch

from .cache import AnswerCache
from .data import Rows

TRAIN_TOKENS = 2560      # a training batch's most tokens (rows times the longest): memory


class Corpus:
    """The rows of the cache's parts whose source is in (or, `exclude`, not in) `sources`."""

    def __init__(self, cache: AnswerCache, sources: set[str], exclude: bool, width: int,
                 max_len: int) -> None:
        self.width, self.max_len = width, max_len
        self.files: list[str] = []
        self.ids: list[np.ndarray] = []           # per part: its ids
        self.top_ids: list[np.ndarray] = []       # per part: (answer positions, K)
        self.top_logp: list[np.ndarray] = []
        rows = []          # (part, token start, prompt_len, answer_len, label start)
        self.sources: dict[str, list[int]] = {}
        for p, name in enumerate(cache.parts()):
            part = cache.read(name)
            if part.top_ids is None:
                with np.load(cache.labels_path(name)) as z:
                    part.top_ids, part.top_logp = z["top_ids"], z["top_logp"]
            self.files.append(str(cache.features_path(name)))
            self.ids.append(part.ids)
            self.top_ids.append(part.top_ids)
            self.top_logp.append(part.top_logp)
            start = label = 0
            for m, pl, al in zip(part.meta, part.prompt_len.tolist(), part.answer_len.tolist()):
                if (m["source"] in sources) != exclude and al > 0:
                    rows.append((p, start, pl, al, label))
                    counts = self.sources.setdefault(m["source"], [0, 0])
                    counts[0] += 1
                    counts[1] += al
                start += pl + al
                label += al
        self.rows = np.array(rows, np.int64).reshape(-1, 5)
        # rows sorted by length: a batch drawn from neighbours in this order pads little
        self.by_length = np.argsort(self.rows[:, 2] + self.rows[:, 3], kind="stable")

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def positions(self) -> int:
        return int(self.rows[:, 3].sum()) if len(self.rows) else 0

    def answer_tokens(self, parity: int | None = None) -> np.ndarray:
        """Every answer token of the rows (what the draft vocabulary must cover); with
        `parity` 0 or 1, of the even or odd rows only."""
        rows = self.rows.tolist() if parity is None else self.rows[parity::2].tolist()
        return np.concatenate([self.ids[p][s + pl:s + pl + al] for p, s, pl, al, _ in rows]) \
            if rows else np.zeros(0, np.int32)

    def draw(self, gen: torch.Generator, n: int) -> Rows:
        """Up to n rows of similar length from a random place in length order (little
        padding), as many as fit in TRAIN_TOKENS tokens (the unrolled steps' attention and
        logits grow with a batch's rows times its length)."""
        first = int(torch.randint(0, max(1, len(self) - n + 1), (1,), generator=gen))
        index = self.by_length[first:first + n]
        return self.select(torch.from_numpy(index[:self.fits(index, n)]))

    def fits(self, index: np.ndarray, n: int) -> int:
        """How many of the rows at `index` (in length order) one batch takes."""
        lengths = np.minimum(self.rows[index, 2] + self.rows[index, 3], self.max_len)
        return max(1, min(n, TRAIN_TOKENS // max(1, int(lengths.max()))))

    def steps(self, epochs: float, n: int) -> int:
        """Optimizer steps for `epochs` passes when batches take up to n rows (fewer when long:
        `fits`)."""
        lengths = np.minimum(self.rows[:, 2] + self.rows[:, 3], self.max_len)
        per_batch = np.clip(TRAIN_TOKENS // np.maximum(lengths, 1), 1, n)
        return max(1, int(np.ceil(epochs * float((1.0 / per_batch).sum()))))

    def select(self, index: torch.Tensor) -> Rows:
        """The rows at `index` as right-padded Rows, cut to max_len (a long prompt's start)."""
        picked = self.rows[index.numpy()]
        cut = [max(0, pl + al - self.max_len) for _, _, pl, al, _ in picked.tolist()]
        T = max(pl + al - c for (_, _, pl, al, _), c in zip(picked.tolist(), cut))
        B, K = len(picked), self.top_ids[0].shape[1]
        rows = Rows(torch.zeros(B, T, dtype=torch.long), torch.zeros(B, T, dtype=torch.bool),
                    torch.zeros(B, T, K, dtype=torch.int32),
                    torch.full((B, T, K), -float("inf"), dtype=torch.float16),
                    torch.zeros(B, T, dtype=torch.long),
                    torch.zeros(B, T, self.width, dtype=torch.float16))
        for b, ((p, s, pl, al, ls), c) in enumerate(zip(picked.tolist(), cut)):
            n = pl + al - c
            rows.ids[b, :n] = torch.from_numpy(self.ids[p][s + c:s + pl + al].astype(np.int64))
            rows.features[b, :n] = torch.from_numpy(_read(self.files[p], s + c, n, self.width))
            lo = max(0, c - (pl - 1))                 # answers' labels cut with the prompt
            span = slice(pl - 1 - c + lo, pl - 1 - c + al)   # position p-1+j: token j's
            rows.mask[b, span] = True
            top = self.top_ids[p][ls + lo:ls + al]
            rows.top_ids[b, span] = torch.from_numpy(top)
            rows.top_logp[b, span] = torch.from_numpy(self.top_logp[p][ls + lo:ls + al])
            rows.argmax[b, span] = torch.from_numpy(top[:, 0].astype(np.int64))
        return rows


def draft_vocabulary(corpus: Corpus, vocab: int, size: int | None, coverage: float,
                     ladder: tuple[int, ...]) -> tuple[list[int], torch.Tensor, torch.Tensor, float]:
    """The draft vocabulary: the `size` tokens the target writes most often in the corpus'
    answers (ties: the lower id), or, with size None, the smallest rung of `ladder` whose
    tokens, counted on the even rows, make up `coverage` of the odd rows' answer tokens —
    coverage of answers not counted, as the held-out ones and the runtime's will be (the
    last rung if none does: the ladder ends at the most the head may cost). Sorted by id,
    with d2t[d] = target id - d (EAGLE-3's and vLLM speculators' layout) and t2d a mask over
    the target's vocabulary; returns (ids, d2t, t2d, the share of the odd rows' answer tokens
    the rung's counting covers)."""
    fit, check = corpus.answer_tokens(0), corpus.answer_tokens(1)
    if len(check) == 0:
        fit = check = corpus.answer_tokens()
    held = np.bincount(check, minlength=vocab)
    order = np.argsort(-np.bincount(fit, minlength=vocab), kind="stable")
    share = np.cumsum(held[order]) / max(held.sum(), 1)
    if size is None:
        size = next((n for n in ladder if share[min(n, vocab) - 1] >= coverage), ladder[-1])
    size = min(size, vocab)
    counts = np.bincount(corpus.answer_tokens(), minlength=vocab)
    ids = sorted(np.argsort(-counts, kind="stable")[:size].tolist())
    ids_t = torch.tensor(ids)
    d2t = ids_t - torch.arange(len(ids))                                   # (Vd,) int64
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[ids_t] = True
    return ids, d2t, t2d, float(share[size - 1])


def _read(path: str, start: int, n: int, width: int) -> np.ndarray:
    """Rows start .. start+n of a features file (float16, `width` columns), read (not
    mapped: a training run's memory holds one batch of features)."""
    return np.fromfile(path, np.float16, count=n * width, offset=start * width * 2
                       ).reshape(n, width)
