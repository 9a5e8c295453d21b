"""`Generator`: load a bundle and generate text with speculative decoding.

    gen = Generator.load("bundle/")
    res = gen.generate("def fib(n):", max_new_tokens=64, k=4)   # k=0: target alone
    res = gen.generate("def fib(n):", temperature=0.8, top_p=0.95, seed=1, stop=["\\n\\n"])
"""
from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Iterator, Literal, Sequence

from . import cache, contract
from .backends import Threads, open_backend
from .backends.select import CUDA_PROVIDER
from .batch import Batch
from .errors import ConfigError
from .manifest import Manifest, read_manifest
from .request import GenerationResult, Mode, Request, check_settings, make_rule
from .round.drafting import Drafter, Schedule, SplitDrafter
from .round.features import HeadDrafter, attach
from .round.heads import HeadSessions
from .round.logprobs import MAX_TOP, Logprobs
from .round.lookup import DRAFT_SOURCES, EARLIER, Lookup
from .round.loop import Stats
from .round.grammar import Constraint, tokenizer_for
from .round.schema_length import TokenPieces
from .round.rules import Rule
from .round.sampling import SamplingParams
from .round.suffix import DEFAULT_BUDGET, SuffixStore
from .scheduler.planner import Knowledge
from .text import TextCodec

DRAFTERS = {"sequential": Drafter, "split": SplitDrafter}
_SPLIT_HEAD = ("mode='split' cannot draft with a feature-level head: its first draft reads the "
               "features of the verification that split mode would draft beside (docs/design.md "
               "§14). ---> HINT: use mode='sequential' (the default).")


class Generator:
    def __init__(self, root: Path, manifest: Manifest, backend: str = "auto",
                 threads: Threads = None, fused_heads: bool | None = None,
                 mode: Mode = "sequential", max_batch: int = 1,
                 recalibrate: bool = False, draft_backend: str | None = None,
                 suffix_budget: int = DEFAULT_BUDGET) -> None:
        self.root, self.manifest, self.mode = root, manifest, _checked_mode(mode)
        self.max_batch = _checked_batch(max_batch, manifest)
        self.codec = TextCodec(root, manifest.tokenizer)
        opened = open_backend(root, manifest, backend, threads, mode, self.max_batch,
                              recalibrate, draft_backend)
        self.target, self.draft = opened.target, opened.draft
        self.backend = opened.backend            # "cpu" | "cuda" | "trt": the target's
        self.draft_backend = opened.draft_backend or opened.backend
        self.backend_reason = opened.reason      # e.g. "cpu (auto): trt skipped: TensorRT …"
        self.placement = opened.placement        # CPU threads and their source (None on a GPU)
        if fused_heads is None:              # on a device, decisions stay next to the logits
            fused_heads = self.backend != "cpu" and bool(manifest.heads)
        self.heads = HeadSessions(root, manifest.heads, _head_device(self.backend)) \
            if fused_heads else None
        self.eos_ids = set(manifest.tokenizer.eos_token_ids)
        self.last_result: GenerationResult | None = None
        self._grammar_tokenizer: Any = None          # llguidance's, for response_format
        self._token_pieces: TokenPieces | None = None   # its tokens' bytes, for least lengths
        # what k="auto" learns and measures, for every sequence and batch (the planner's)
        self.knowledge = Knowledge(self.target, self.draft, manifest, self.measurement_key,
                                   recalibrate, self.max_batch)
        self._busy = threading.Lock()                # held while a batch holds the slots
        # a feature-level head reads the target's features, which the target's calls leave in
        # this store (round/features.py, docs/design.md §14)
        self.features = attach(self.target, self.draft, self.max_batch) \
            if manifest.draft.kind in contract.HEADS else None
        if self.features is not None and self.mode == "split":
            raise ConfigError(_SPLIT_HEAD)
        # earlier requests' text, per tenant, for draft_source="suffix" (round/suffix.py)
        self.suffixes = SuffixStore(_checked_budget(suffix_budget))

    @classmethod
    def load(cls, bundle: str | Path, backend: str = "auto", threads: Threads = None,
             verify: bool = True, fused_heads: bool | None = None,
             mode: Mode = "sequential", max_batch: int = 1,
             recalibrate: bool = False, draft_backend: str | None = None,
             suffix_budget: int = DEFAULT_BUDGET) -> Generator:
        """Open a bundle written by ssd-export; `verify` checks every file's sha256 (a file
        unchanged since an earlier load's check is not hashed again: docs/design.md §8.1).
        `backend`: auto (trt, then cuda, then cpu; `gen.backend_reason` says why), cpu, cuda
        or trt. `fused_heads`: make decisions with the bundle's ONNX heads (default: on a
        GPU, where they read the device logits and return token ids). `mode`: the mode
        generate() runs by default and, with `threads=None`, the one the CPU threads are
        chosen for (split: one core for the draft's thread, the rest for the target).
        `max_batch`: KV slots for that many sequences decoded together (generate_batch,
        batch(); up to the bundle's own max_batch; on the CPU backend, or cuda with a static
        bundle, design §11). The CPU threads chosen by
        timing and the calibrations of k="auto" are remembered per bundle and machine
        (docs/design.md §8.1); `recalibrate` measures them again and remembers the new.
        `draft_backend="cpu"`: the draft on the host's cores beside a cuda or trt target
        (docs/design.md §9; with mode="split" it drafts during the GPU's verification).
        `suffix_budget`: bytes kept of earlier requests' text for draft_source="suffix"."""
        root = Path(bundle)
        return cls(root, read_manifest(root, verify=verify), backend, threads, fused_heads, mode,
                   max_batch, recalibrate, draft_backend, suffix_budget)

    def generate(self, prompt: str | Sequence[int], max_new_tokens: int = 128,
                 k: int | Literal["auto"] = "auto", **settings: Any) -> GenerationResult:
        """The whole generation at once; `settings` are stream()'s (temperature, top_k, top_p,
        seed, stop, mode, the logits processors, ignore_eos)."""
        for _ in self._alone(self.request(prompt, max_new_tokens, k, **settings),
                             pieces=False):
            pass
        assert self.last_result is not None
        return self.last_result

    def stream(self, prompt: str | Sequence[int], max_new_tokens: int = 128,
               k: int | Literal["auto"] = "auto", **settings: Any) -> Iterator[str]:
        """Yield text pieces as tokens are accepted; `last_result` holds the whole result.
        `settings` are request()'s: temperature, top_k, top_p, seed, stop, mode,
        repetition/presence/frequency penalties, logit_bias, min_new_tokens, ignore_eos,
        coupling. Bad settings raise ConfigError here, before the first piece."""
        return self._alone(self.request(prompt, max_new_tokens, k, **settings))

    def request(self, prompt: str | Sequence[int], max_new_tokens: int = 128,
                k: int | Literal["auto"] = "auto",
                temperature: float | None = None, top_k: int | None = None,
                top_p: float | None = None, seed: int | None = None,
                stop: Sequence[str] | None = None, mode: Mode | None = None,
                repetition_penalty: float | None = None,
                presence_penalty: float = 0.0, frequency_penalty: float = 0.0,
                logit_bias: dict[int, float] | None = None, min_new_tokens: int = 0,
                ignore_eos: bool = False, coupling: str = "auto", fused: bool = True,
                draft_source: str = "fused", tenant: str | None = None,
                prediction: str | Sequence[int] | None = None,
                logprobs: int | Logprobs | None = None,
                response_format: dict[str, Any] | Constraint | None = None,
                forced_tokens: bool = True) -> Request:
        """One sequence's settings, checked (ConfigError), with its acceptance rule: what
        stream() decodes, and what a batch (batch.py) takes per sequence.

        Unset temperature, top_k, top_p and repetition_penalty take `defaults()`, an unset
        mode the one the generator was loaded for; `ignore_eos` generates on past EOS
        (benchmarks of a fixed length). `coupling` (sampling.COUPLINGS): with a seed, by
        default, the tokens are the target alone's for that seed whatever k, mode or
        backend; "rejection" keeps the rule that accepts most. `fused=False`: the rule
        decides on the host even where the bundle's heads could (batches do).
        `draft_source` (docs/design.md §6.1): "fused" drafts continuations found earlier in
        the sequence (lookup) where they pay and the draft model elsewhere, "model" the
        draft model alone, "lookup" lookup alone; "suffix" lookup with the text of earlier
        requests of the same `tenant` (model-free, as vLLM's suffix method: round/suffix.py;
        the request's prompt and output join that text when it ends), "fused+suffix" that
        fused with the draft model. `prediction` (text or ids; OpenAI's
        predicted outputs): the output the caller expects, offered to drafting as a lookup
        source whatever `draft_source` (the schedule still takes it only where it pays); the
        output stays the target's, and stats count its tokens drafted and accepted.
        `logprobs` (0..20): the result carries the target's log-probability of each token
        and of that many likeliest alternatives (round/logprobs.py); a `Logprobs` given
        instead collects them as the sequence decodes (the server streams them from it).
        `response_format` (OpenAI's: {"type": "text" | "json_object" | "json_schema",
        "json_schema": {"name", "schema", "strict"}}, or a `constraint()`): the output follows
        the grammar, masked on the draft's proposals and the target's verification alike
        (round/grammar.py), so it is the constrained target alone's; a `max_new_tokens` that
        no output valid under it fits in is refused (round/schema_length.py). The tokens the
        grammar forces are verified as free drafts at any k; `forced_tokens=False` drafts
        none of them (docs/design.md §4). `tenant`: who asks (ssd-serve: the id of the
        request's API key), carried on the Request as given."""
        top = logprobs.top if isinstance(logprobs, Logprobs) else logprobs
        if top is not None and (not isinstance(top, int) or isinstance(top, bool)
                                or not 0 <= top <= MAX_TOP):
            raise ConfigError(f"logprobs={top!r} must be an integer in [0, {MAX_TOP}] "
                              f"(alternatives per token), or None.")
        if isinstance(top, int) and not isinstance(logprobs, Logprobs):
            logprobs = Logprobs(top)
        if logit_bias is not None and not isinstance(logit_bias, dict):
            raise ConfigError(f"logit_bias must be a dict {{token id: bias}}, not "
                              f"{type(logit_bias).__name__}.")
        given = dict(temperature=temperature, top_k=top_k, top_p=top_p,
                     repetition_penalty=repetition_penalty)
        unset = self.defaults()
        params = SamplingParams(**{name: unset[name] if value is None else value
                                   for name, value in given.items()}, seed=seed,
                                presence_penalty=presence_penalty,
                                frequency_penalty=frequency_penalty,
                                logit_bias=tuple(sorted((logit_bias or {}).items())),
                                min_new_tokens=min_new_tokens, coupling=coupling)
        if draft_source not in DRAFT_SOURCES:
            raise ConfigError(f"draft_source={draft_source!r} is unknown; choose one of "
                              f"{', '.join(DRAFT_SOURCES)}.")
        ids = self._prompt_ids(prompt)
        check_settings(k, self.manifest.max_draft, max_new_tokens, stop)
        mode = self.mode if mode is None else _checked_mode(mode)
        vocab = self.manifest.target.vocab_size
        if any(token >= vocab for token, _ in params.logit_bias):
            raise ConfigError(f"logit_bias: token id {max(logit_bias)} is outside the "
                              f"vocabulary [0, {vocab}).")
        draft_vocab = self.manifest.draft.vocab_size
        # the heads judge draft and target rows of one width: a padded pair decides on the host
        heads = self.heads if fused and draft_vocab == vocab else None
        constraint = self.constraint(response_format)
        if constraint is not None and (mode == "split" or ignore_eos or min_new_tokens):
            raise ConfigError(f"response_format {constraint.name} cannot be used with "
                              + ("mode='split' (its bet thread would move the grammar's "
                                 "matcher while the target's rows are judged)" if mode == "split"
                                 else "ignore_eos or min_new_tokens (the grammar decides where "
                                      "the output ends: EOS once it is complete)")
                              + ". ---> HINT: leave that setting out.")
        if constraint is not None:
            constraint.check_room(max_new_tokens)
        rule = make_rule(params, heads, ids, max(vocab, draft_vocab), self.eos_ids, constraint,
                         forced_tokens)
        eos = set() if ignore_eos else self.eos_ids
        # acceptance is learnt per kind of rule: the invariant one accepts a little less
        kind = "greedy" if params.greedy else "invariant" if params.invariant else "sampled"
        earlier = self.suffixes.view(tenant) if draft_source in EARLIER else None
        return Request(ids, rule, eos, max_new_tokens, k, list(stop or []), mode, kind,
                       draft_source, self._prediction_ids(prediction, len(ids)), logprobs,
                       tenant=tenant, earlier=earlier)

    def batch(self, k: int | Literal["auto"] = "auto", slots: int | None = None) -> Batch:
        """A batch over `slots` (default: all max_batch) of this generator's slots (batch.py):
        add sequences, step rounds. It holds the generator (like a stream) until closed; use
        it as a context."""
        return self._open(k, slots, "a batch")

    def generate_batch(self, prompts: Sequence[Any], max_new_tokens: int = 128,
                       k: int | Literal["auto"] = "auto", **settings: Any
                       ) -> list[GenerationResult]:
        """One result per prompt, in order, decoded together max_batch at a time (more wait
        for a free slot). A prompt is text, token ids, or a dict with "prompt" and its own
        settings (max_new_tokens, temperature, top_k, top_p, seed, stop, penalties,
        logit_bias, k, ...) over `settings`. A prompt whose settings are refused gets a
        result with stop_reason "error" and the reason in `error`; the others run."""
        if isinstance(prompts, (str, dict)) or not isinstance(prompts, Sequence) or not prompts:
            raise ConfigError("generate_batch takes a non-empty list of prompts (text, token "
                              "ids, or dicts with a 'prompt'). ---> HINT: for one prompt use "
                              "generate().")
        results: list[GenerationResult | None] = [None] * len(prompts)
        index: dict[int, int] = {}
        with self.batch(k) as batch:
            for i, item in enumerate(prompts):
                own = {**settings, "max_new_tokens": max_new_tokens}
                try:
                    if isinstance(item, dict):
                        if "prompt" not in item:
                            raise ConfigError(f"prompts[{i}] has no 'prompt'.")
                        own.update(item)
                        item = own.pop("prompt")
                    index[batch.add(item, pieces=False, **own)] = i
                except (ConfigError, TypeError) as exc:
                    results[i] = GenerationResult([], "", "error", Stats(backend=self.backend),
                                                  error=f"prompts[{i}]: {exc}")
            while batch.active:
                for event in batch.step():
                    if event.result is not None:
                        results[index[event.id]] = event.result
        assert all(r is not None for r in results)
        return results  # type: ignore[return-value]

    def release(self) -> None:
        """A batch gives the slots back (Batch.close)."""
        self._busy.release()

    def _open(self, k: int | Literal["auto"], slots: int | None, what: str) -> Batch:
        """A batch over the slots, which it holds until closed (ConfigError if another holds
        them: `what` names what could not start)."""
        if not self._busy.acquire(blocking=False):
            raise ConfigError(f"this Generator is already decoding another sequence (a stream "
                              f"or a batch holds its KV slots), so {what} cannot start. "
                              f"---> HINT: finish or close() the other first, decode them "
                              f"together in one batch (gen.batch(), generate_batch), or load "
                              f"a second Generator (ssd-serve batches or queues requests for "
                              f"you).")
        try:
            return Batch(self, k, slots)
        except BaseException:
            self._busy.release()
            raise

    def defaults(self, openai: bool = False) -> dict[str, float]:
        """What an unset temperature, top_k, top_p or repetition_penalty means: the value the
        target's generation_config sets (recorded at export; sampling ones only when it sets
        do_sample, as Hugging Face's generate), else off — greedy, or with `openai` (the
        server) temperature 1 as the OpenAI API has it."""
        g = self.manifest.generation
        sample = g.get("do_sample", False)
        return {"temperature": g.get("temperature", 1.0) if sample else float(openai),
                "top_k": g.get("top_k", 0) if sample else 0,
                "top_p": g.get("top_p", 1.0) if sample else 1.0,
                "repetition_penalty": g.get("repetition_penalty", 1.0)}

    def _alone(self, req: Request, pieces: bool = True) -> Iterator[str]:
        """One sequence: a batch of one slot, stepped until it ends (`last_result`). One user
        of the KV slots at a time: a second stream decoding beside the first would overwrite
        its rows. Taken when decoding starts, freed when the stream ends or is closed."""
        with self._open(req.k, 1, "another sequence") as batch:
            batch.submit(req, pieces)
            while batch.active:
                for event in batch.step():
                    if event.text:
                        yield event.text
                    if event.result is not None:
                        self.last_result = event.result

    def drafter(self, rule: Rule, schedule: Schedule, lookup: Lookup | None, slot: int,
                mode: Mode = "sequential") -> Drafter:
        """One row's draft state in `slot`: a head's (round/features.py) or a model's."""
        vocab = (self.manifest.target.vocab_size, self.manifest.draft.vocab_size)
        if self.features is not None:
            if mode == "split":
                raise ConfigError(_SPLIT_HEAD)
            return HeadDrafter(self.draft, rule, schedule, vocab, lookup, slot, self.features)
        return DRAFTERS[mode](self.draft, rule, schedule, vocab, lookup, slot)

    def encode(self, text: str) -> list[int]:
        return self.codec.encode(text)

    def measurement_key(self, what: str, **more: Any) -> dict[str, Any] | None:
        """What a timing of this generator's sessions is remembered under (cache.py): the
        bundle, the machine, ONNX Runtime, the threads, `more`. None on a GPU backend, where
        nothing is remembered: steps take milliseconds there, so measuring again is cheap, and
        the key would have to name the GPU (docs/design.md §8.1)."""
        if self.backend != "cpu":
            return None
        return cache.measurement_key(self.manifest.digest(), what, backend=self.backend,
                                     threads=[self.target.threads, self.draft.threads], **more)

    def _prompt_ids(self, prompt: str | Sequence[int]) -> list[int]:
        if isinstance(prompt, str):
            ids = self.codec.encode(prompt)
        elif isinstance(prompt, Sequence) and all(isinstance(i, int) for i in prompt):
            ids = list(prompt)
        else:
            raise ConfigError("the prompt must be a string or a list of token ids (ints).")
        limit, vocab = self.manifest.max_context, self.manifest.target.vocab_size
        if not ids:
            raise ConfigError("the prompt is empty: give at least one token or character.")
        if len(ids) > limit:
            raise ConfigError(f"the prompt has {len(ids)} tokens, more than the bundle's "
                              f"max_context {limit}. ---> HINT: shorten it, or re-export with "
                              f"ssd-export --max-context {len(ids) + 256}.")
        bad = [i for i in ids if not 0 <= i < vocab]
        if bad:
            raise ConfigError(f"prompt token id {bad[0]} is outside the vocabulary [0, {vocab}).")
        return ids

    def constraint(self, response_format: dict[str, Any] | Constraint | None
                   ) -> Constraint | None:
        """OpenAI's response_format compiled for this bundle's tokenizer (None: text, or none);
        ConfigError naming response_format for what cannot be honoured."""
        if response_format is None or isinstance(response_format, Constraint):
            return response_format
        vocab = self.manifest.target.vocab_size
        if self._grammar_tokenizer is None:        # built once: each walks the vocabulary
            self._grammar_tokenizer = tokenizer_for(self.codec.tokenizer.to_str(), vocab,
                                                    sorted(self.eos_ids))
            self._token_pieces = TokenPieces.of(self._grammar_tokenizer)
        return Constraint.compile(response_format, self._grammar_tokenizer, vocab,
                                  self._token_pieces)

    def _prediction_ids(self, prediction: str | Sequence[int] | None,
                        prompt_len: int) -> list[int] | None:
        """The prediction tokenised once (text), or checked (ids); None when there is none.
        Longer than the context leaves after the prompt, it could never be emitted whole: a
        ConfigError naming it."""
        if prediction is None:
            return None
        if isinstance(prediction, str):
            ids = self.codec.tokens(prediction) if prediction else []   # no BOS
        elif isinstance(prediction, Sequence) and all(isinstance(i, int) and
                                                      not isinstance(i, bool)
                                                      for i in prediction):
            ids = list(prediction)
        else:
            raise ConfigError("prediction must be a string or a list of token ids (ints).")
        vocab, room = self.manifest.target.vocab_size, self.manifest.max_context - prompt_len
        bad = [i for i in ids if not 0 <= i < vocab]
        if bad:
            raise ConfigError(f"prediction: token id {bad[0]} is outside the vocabulary "
                              f"[0, {vocab}).")
        if len(ids) > room:
            raise ConfigError(f"prediction has {len(ids)} tokens, more than the {room} the "
                              f"context ({self.manifest.max_context}) leaves after the prompt's "
                              f"{prompt_len}. ---> HINT: predict only the part of the output "
                              f"you expect, or shorten the prompt.")
        return ids or None


def _checked_batch(max_batch: int, manifest: Manifest) -> int:
    if not isinstance(max_batch, int) or isinstance(max_batch, bool) or max_batch < 1:
        raise ConfigError(f"max_batch={max_batch!r} must be a positive integer.")
    if max_batch > manifest.max_batch:
        raise ConfigError(f"max_batch={max_batch} is more than this bundle was exported and "
                          f"checked for ({manifest.max_batch}"
                          + (f", schema {manifest.schema_version}: bundles before schema 6 take "
                             f"one sequence per call" if manifest.schema_version < 6 else "")
                          + f"). ---> HINT: re-export with ssd-export --max-batch {max_batch}, "
                            f"or load with max_batch <= {manifest.max_batch}.")
    return max_batch


def _checked_budget(budget: int) -> int:
    if not isinstance(budget, int) or isinstance(budget, bool) or budget < 0:
        raise ConfigError(f"suffix_budget={budget!r} must be a number of bytes >= 0 (0 keeps "
                          f"no earlier requests).")
    return budget


def _checked_mode(mode: str) -> Mode:
    if mode not in DRAFTERS:
        raise ConfigError(f"mode={mode!r} is unknown; choose one of {', '.join(DRAFTERS)}.")
    return mode


def _head_device(backend: str) -> str:
    """Heads run where the logits are when ONNX Runtime can run there; on the trt backend
    without onnxruntime-gpu they run on the CPU from a host copy of the logits."""
    if backend == "cpu":
        return "cpu"
    import onnxruntime as ort

    return "cuda" if CUDA_PROVIDER in ort.get_available_providers() else "cpu"
