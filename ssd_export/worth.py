"""A draft's worth, measured at export (docs/design.md §6, §8): the deployed graphs' top-1
agreement on held-out text, a quick calibration of the cost model, and the speed-up they
predict. `ssd-export` prints it, records it as the manifest's `pair_worth`, and warns in one
line when speculation is not expected to pay.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from ssd_runtime.backends import open_backend
from ssd_runtime.backends.base import ModelSession
from ssd_runtime.errors import BackendError, ConfigError
from ssd_runtime.machine import cpu_cores
from ssd_runtime.manifest import Manifest
from ssd_runtime.scheduler.calibration import calibrate
from ssd_runtime.scheduler.cost import CostModel

from .parity import ort_errors
from .qtarget import heldout_ids

# held-out positions compared: 256 give α to about ±3 points (binomial standard error at
# α = 0.5), and both graphs read them in a few dozen calls
WORTH_TOKENS = 256
# calibration passes after the warm-up: the runtime's own calibration takes 9 (design §6);
# 3 keep the check cheap, and the prediction is a rough one anyway (α on held-out text)
REPEATS = 3
# below this predicted speed-up over the target alone, speculation is not worth a draft
PAYS = 1.05
LOOKUP = "--draft-source lookup on ssd-run, ssd-bench, ssd-serve"
# without --calib, the held-out text is the target's own: greedy continuations of this many
# new tokens after the first tokens of each default text, until WORTH_TOKENS are written
OWN_PROMPT_TOKENS, OWN_NEW_TOKENS = 16, 48


@dataclass(frozen=True)
class Worth:
    """What the pair measured at export, and what the cost model predicts from it."""

    text: str                        # where the held-out text came from
    max_draft: int
    agreement: float | None = None   # draft argmax == target argmax, teacher-forced
    tokens: int = 0                  # positions compared
    cost: CostModel | None = None    # None: not timed
    backend: str = ""                # where the timing ran: "cpu", "cuda", "trt"
    threads: str = ""                # target:draft intra-op threads (cpu)
    note: str = ""                   # what was skipped, and why

    @property
    def speedups(self) -> list[float]:
        """Predicted speed-up over the target alone at k = 0..max_draft (1 at k = 0), with
        α = the agreement: a greedy draft token is accepted iff it is the target's argmax."""
        if self.cost is None or self.agreement is None:
            return []
        return [self.cost.speedup(self.agreement, k) for k in range(self.max_draft + 1)]

    @property
    def best_k(self) -> int | None:
        s = self.speedups
        return max(range(len(s)), key=s.__getitem__) if s else None

    @property
    def pays(self) -> bool | None:
        """Whether speculation is expected to pay (None: not predicted)."""
        k = self.best_k
        return None if k is None else k > 0 and self.speedups[k] >= PAYS

    def as_dict(self) -> dict:
        cost, k = self.cost, self.best_k
        return {"agreement": _round(self.agreement), "alpha": _round(self.agreement),
                "tokens": self.tokens, "text": self.text, "backend": self.backend,
                "threads": self.threads,
                "c": _round(cost.c) if cost else None,
                "c_first": _round(cost.c_first) if cost else None,
                "v": [_round(cost.v(i)) for i in range(len(cost.verify))] if cost else [],
                "speedups": [_round(s) for s in self.speedups],
                "best_k": k, "speedup": _round(self.speedups[k]) if k is not None else None,
                "pays": self.pays, "note": self.note}

    def line(self) -> str:
        """The progress line."""
        if self.agreement is None:
            return f"    pair worth: not measured ({self.note})"
        text = (f"    pair worth: top-1 agreement {self.agreement:.3f} on {self.tokens} "
                f"held-out tokens of {self.text} (α ≈ {self.agreement:.2f})")
        if self.cost is None:
            return f"{text}; not timed ({self.note})"
        k = self.best_k
        where = self.backend + (f", {self.threads} threads" if self.threads else "")
        return (f"{text}; c = {self.cost.c:.3f} on {where}: predicted "
                f"{self.speedups[k]:.2f}x the target alone at k = {k}")

    def warning(self, draft_quant: str) -> str | None:
        """One line when speculation is not expected to pay, saying what to try; else None."""
        if self.pays is not False:
            return None
        k = self.best_k
        if draft_quant == "none":
            draft = "another draft, or --draft-quant int8 (a cheaper draft step)"
        elif self.agreement < 0.9:
            draft = (f"another draft, or --draft-quant none (this draft is {draft_quant}; a "
                     f"float one agrees more)")
        else:           # it agrees: its step is what costs (the target's own int8 copy beside
            #             an int8 target is the target)
            draft = "a draft with a cheaper step (this one agrees; its step is what costs)"
        return (f"    warning: speculation is not expected to pay for this pair: the draft "
                f"agrees with the target on {self.agreement:.1%} of next tokens at c = "
                f"{self.cost.c:.3f}, so the best k is {k} ({self.speedups[k]:.2f}x the target "
                f"alone); try {draft}, or serving with lookup drafts only ({LOOKUP})")


def measure_worth(root: Path, manifest: Manifest, tokenizer, heldout: tuple[list[str], str],
                  own: bool = False) -> Worth:
    """Open the bundle's graphs (as written: quantized, with engines if built) the way the
    runtime does, compare their argmax over the held-out text and time them. `own`: the text
    is the target graph's own continuations of the held-out texts' openings. What cannot run
    here (a graph this machine's ONNX Runtime refuses, too little held-out text) is skipped
    and said in `note`; it never fails the export."""
    worth = Worth(text=heldout[1], max_draft=manifest.max_draft)
    try:
        opened = open_backend(root, manifest, "auto", threads=placement(manifest))
    except (BackendError, *ort_errors()) as exc:
        return skipped(worth, f"the graphs did not open here: {first_line(exc)}")
    target, draft = opened.target, opened.draft
    vocab = min(manifest.target.vocab_size, manifest.draft.vocab_size)
    try:
        texts, source = own_continuations(target, tokenizer, heldout, manifest) if own \
            else heldout
        worth = replace(worth, text=source)
        windows = heldout_ids(tokenizer, texts, vocab, manifest.max_context, WORTH_TOKENS,
                              "the pair's worth")
        agree, total = agreement(target, draft, windows)
    except ConfigError as exc:
        return skipped(worth, str(exc).split(" ---> ")[0])
    except (BackendError, *ort_errors()) as exc:
        return skipped(worth, f"the graphs did not run here: {first_line(exc)}")
    threads = f"{target.threads}:{draft.threads}" if opened.backend == "cpu" else ""
    worth = Worth(source, manifest.max_draft, agree / total, total, backend=opened.backend,
                  threads=threads)
    try:
        cost = calibrate(target, draft, manifest.max_draft, repeats=REPEATS)
    except (BackendError, *ort_errors()) as exc:
        return replace(worth, note=f"the timing did not run on {opened.backend}: "
                                   f"{first_line(exc)}")
    return replace(worth, cost=cost)


def own_continuations(target: ModelSession, tokenizer, heldout: tuple[list[str], str],
                      manifest: Manifest) -> tuple[list[str], str]:
    """Held-out text from the target's own distribution, for a check without --calib: each
    held-out text's first OWN_PROMPT_TOKENS tokens and the target graph's greedy continuation
    of them (the deployed target, quantized or not; to its EOS at most), until WORTH_TOKENS
    tokens. A draft is asked to guess the target's continuations, not human text, and a
    prediction made on human text can fall far short of what the bundle then measures
    (docs/export.md, "A draft's worth")."""
    texts, source = heldout
    eos = set(manifest.tokenizer.eos_token_ids)
    written, total = [], 0
    for text in texts:
        ids = [int(t) for t in tokenizer(text)["input_ids"][:OWN_PROMPT_TOKENS]]
        if len(ids) > 1:
            target.prefill(np.asarray(ids[:-1], np.int64))
        for _ in range(OWN_NEW_TOKENS):
            logits = target.forward(np.asarray(ids[-1:], np.int64), len(ids) - 1)  # (1, V)
            ids.append(int(np.asarray(logits[0]).argmax()))
            if ids[-1] in eos:
                break
        written.append(tokenizer.decode(ids, skip_special_tokens=True))
        total += len(ids)
        if total >= WORTH_TOKENS:
            break
    return written, f"the target's greedy continuations of {len(written)} openings of {source}"


def placement(manifest: Manifest) -> tuple[int, int]:
    """(target, draft) intra-op threads on the CPU: every core for the target, and one for a
    draft of at most half its parameters (a small draft's step is too short to share, which is
    what a load's timing finds too, design §9), else every core too, so that a
    draft as large as the target is timed on the same terms. Fixed rather than timed as a
    load does: timing the choice takes longer than the whole check, and a load remembers it
    (design §8.1) under the manifest, which is not final yet."""
    cores = cpu_cores()
    small = 0 < 2 * manifest.draft.parameters <= manifest.target.parameters
    return cores, 1 if small else cores


def agreement(target: ModelSession, draft: ModelSession, windows: list[np.ndarray]
              ) -> tuple[int, int]:
    """(positions where the two argmaxes agree, positions): both models read each window
    from an empty cache, teacher-forced on its tokens."""
    agree = total = 0
    for ids in windows:
        picks = [_argmaxes(session, ids) for session in (target, draft)]
        agree += int((picks[0] == picks[1]).sum())
        total += ids.size
    return agree, total


def _argmaxes(session: ModelSession, ids: np.ndarray) -> np.ndarray:
    """The argmax after each token of `ids`, read in calls of at most max_new_len tokens."""
    step, picks = session.max_new_len, []
    for start in range(0, ids.size, step):
        logits = np.asarray(session.forward(ids[start:start + step], start))   # (n, V)
        picks.append(logits.argmax(-1))
    return np.concatenate(picks)


def skipped(worth: Worth, why: str) -> Worth:
    return replace(worth, agreement=None, tokens=0, cost=None, note=why)


def first_line(exc: Exception) -> str:
    return (str(exc) or type(exc).__name__).splitlines()[0].split(" ---> ")[0]


def _round(value: float | None) -> float | None:
    return None if value is None else round(float(value), 4)
