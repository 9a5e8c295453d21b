"""The OpenAI wire format: request models, their validation, response and error bodies.

Every bad request becomes an `ApiError` with an OpenAI-style body
{"error": {"message", "type", "param", "code"}}; nothing here touches the model.
"""
from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..errors import SsdError

if TYPE_CHECKING:
    from ..request import GenerationResult

FINISH_REASON = {"eos": "stop", "stop": "stop", "length": "length", "context": "length"}
MAX_STOPS = 4                                 # as the OpenAI API
MAX_COMPLETION_LOGPROBS, MAX_CHAT_LOGPROBS = 5, 20   # as the OpenAI API
# Fields the OpenAI API has and this server does not implement: allowed only at these values.
UNSUPPORTED_DEFAULTS: dict[str, tuple[Any, ...]] = {
    "n": (None, 1), "best_of": (None, 1), "echo": (None, False), "suffix": (None, ""),
    "tools": (None, []),
    "functions": (None, []), "tool_choice": (None, "none"),
}
# How a field must look, for messages that name the field rather than pydantic's union arms.
FIELD_SHAPES = {
    "prompt": "a string, a list of token ids, or a list holding one of those",
    "messages": "a non-empty list of {\"role\": str, \"content\": str} objects",
    "stop": f"a string or a list of at most {MAX_STOPS} strings",
    "max_tokens": "a positive integer", "max_completion_tokens": "a positive integer",
    "temperature": "a number in [0, 2]", "top_p": "a number in (0, 1]",
    "top_k": "an integer >= 0 (0 turns it off)", "seed": "a non-negative integer",
    "presence_penalty": "a number in [-2, 2]", "frequency_penalty": "a number in [-2, 2]",
    "repetition_penalty": "a number > 0 (1 turns it off)",
    "logit_bias": "an object mapping token ids (as strings) to numbers in [-100, 100]",
    "min_tokens": "an integer >= 0", "ignore_eos": "true or false",
    "stream": "true or false", "model": "a string naming the served model",
    "response_format": "an object {\"type\": \"text\" | \"json_object\" | \"json_schema\", ...}",
    "prediction": "an object {\"type\": \"content\", \"content\": text or text parts}",
}


class ApiError(SsdError):
    """A request the server refuses, with the HTTP status and OpenAI error fields."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 code: str | None = None, type: str = "invalid_request_error",
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.type, self.headers = type, headers or {}

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.type, self.param, self.code)


def error_body(message: str, type: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


class StreamOptions(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")

    include_usage: bool = False


class TextPart(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")

    type: Literal["text"]
    text: str


class PredictionContent(BaseModel):
    """OpenAI's predicted output: {"type": "content", "content": text or text parts}."""

    model_config = ConfigDict(strict=True, extra="forbid")

    type: Literal["content"]
    content: str | list[TextPart]

    @property
    def text(self) -> str:
        return self.content if isinstance(self.content, str) else \
            "".join(part.text for part in self.content)


class _Request(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")

    model: str
    max_tokens: int | None = None
    temperature: float | None = None          # None: the model's default, else 1 (OpenAI)
    top_p: float | None = None                # None: the model's default, else 1
    top_k: int | None = None                  # extension: 0 turns it off
    presence_penalty: float | None = None     # None: 0 (the API lets clients send null)
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None   # extension (as vLLM): Hugging Face's; None: 1
    logit_bias: dict[str, float] | None = None
    min_tokens: int = 0                       # extension (as vLLM): no EOS before this many
    ignore_eos: bool = False                  # extension (as vLLM): generate on past EOS
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    prediction: PredictionContent | None = None   # OpenAI's predicted outputs
    response_format: dict[str, Any] | None = None  # structured outputs (round/grammar.py)
    # extension: false keeps this request out of earlier requests' text (--draft-source suffix):
    # it neither drafts from it nor joins it
    suffix_drafts: bool = True


class CompletionRequest(_Request):
    prompt: str | list[int] | list[str] | list[list[int]]
    logprobs: int | None = None               # the N likeliest per token (0..5), as OpenAI


class ChatMessage(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")

    role: str
    content: str | list[TextPart] | None = None
    name: str | None = None

    def as_template_input(self) -> dict[str, str]:
        content = self.content if isinstance(self.content, str) else \
            "".join(part.text for part in self.content or [])
        return {"role": self.role, "content": content, **({"name": self.name} if self.name else {})}


class ChatCompletionRequest(_Request):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = None  # the newer name of max_tokens
    logprobs: bool | None = None
    top_logprobs: int | None = None           # 0..20, with logprobs: true


_Req = TypeVar("_Req", bound=_Request)


@dataclass(frozen=True)
class Sampling:
    """The generation settings of one request, checked against the server's limits."""

    max_tokens: int
    temperature: float
    top_p: float
    top_k: int
    seed: int | None
    stop: list[str] | None
    penalties: dict[str, Any]                 # penalties, logit_bias, min_new_tokens, ignore_eos
    prediction: str | None = None             # the predicted output's text
    logprobs: int | None = None               # top alternatives per token (None: no logprobs)
    response_format: dict[str, Any] | None = None
    suffix_drafts: bool = True                # may draft from (and join) earlier requests' text

    def options(self, k: int) -> dict[str, Any]:
        return dict(max_new_tokens=self.max_tokens, k=k, temperature=self.temperature,
                    top_k=self.top_k, top_p=self.top_p, seed=self.seed, stop=self.stop,
                    **self.penalties, **({"prediction": self.prediction}
                                         if self.prediction is not None else {}),
                    **({"logprobs": self.logprobs} if self.logprobs is not None else {}),
                    **({"response_format": self.response_format}
                       if self.response_format is not None else {}))


def parse_request(raw: bytes, kind: type[_Req]) -> _Req:
    """JSON bytes -> a request model; malformed JSON or wrong types -> ApiError 400."""
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ApiError(400, f"the request body is not valid JSON ({exc}).") from None
    if not isinstance(data, dict):
        raise ApiError(400, f"the request body must be a JSON object, got {type(data).__name__}.")
    try:
        return kind.model_validate(data)
    except ValidationError as exc:
        raise _from_validation(exc) from None


def sampling(req: CompletionRequest | ChatCompletionRequest, served_name: str,
             max_tokens_limit: int, default_max_tokens: int,
             defaults: dict[str, float]) -> Sampling:
    """Check the model name, limits and ranges; unsupported OpenAI fields must keep defaults.
    `defaults` (Generator.defaults(openai=True)) fill temperature, top_p, top_k and
    repetition_penalty when a request leaves them out: the model's, as vLLM takes them."""
    if req.model != served_name:
        raise ApiError(404, f"the model {req.model!r} does not exist; this server serves "
                            f"{served_name!r} (see GET /v1/models).", "model", "model_not_found")
    _check_unsupported(req.model_extra or {})
    newer = getattr(req, "max_completion_tokens", None)
    name = "max_tokens" if newer is None else "max_completion_tokens"
    max_tokens = getattr(req, name)
    max_tokens = default_max_tokens if max_tokens is None else max_tokens
    if not 1 <= max_tokens <= max_tokens_limit:
        raise ApiError(400, f"{name}={max_tokens} is outside [1, {max_tokens_limit}], this "
                            f"server's limit (ssd-serve --max-tokens-limit).", name)
    temperature, top_p, top_k = (defaults[name] if getattr(req, name) is None
                                 else getattr(req, name) for name in ("temperature", "top_p",
                                                                      "top_k"))
    if not 0 <= temperature <= 2:
        raise ApiError(400, f"temperature={temperature} must be in [0, 2] (0 is greedy).",
                       "temperature")
    if not 0 < top_p <= 1:
        raise ApiError(400, f"top_p={top_p} must be in (0, 1] (1 turns it off).", "top_p")
    if top_k < 0:
        raise ApiError(400, f"top_k={top_k} must be >= 0 (0 turns it off).", "top_k")
    if req.seed is not None and req.seed < 0:
        raise ApiError(400, f"seed={req.seed} must be a non-negative integer.", "seed")
    penalties = {"presence_penalty": _or(req.presence_penalty, 0.0),
                 "frequency_penalty": _or(req.frequency_penalty, 0.0),
                 "repetition_penalty": _or(req.repetition_penalty,
                                           defaults["repetition_penalty"])}
    for name in ("presence_penalty", "frequency_penalty"):
        if not -2 <= penalties[name] <= 2:
            raise ApiError(400, f"{name}={penalties[name]} must be in [-2, 2] (0 turns it "
                                f"off).", name)
    if not penalties["repetition_penalty"] > 0:
        raise ApiError(400, f"repetition_penalty={penalties['repetition_penalty']} must be > 0 "
                            f"(1 turns it off).", "repetition_penalty")
    penalties["logit_bias"] = _logit_bias(req.logit_bias or {})
    if req.min_tokens < 0:
        raise ApiError(400, f"min_tokens={req.min_tokens} must be >= 0.", "min_tokens")
    penalties["min_new_tokens"] = req.min_tokens
    penalties["ignore_eos"] = req.ignore_eos
    stop = [req.stop] if isinstance(req.stop, str) else req.stop
    if stop is not None and len(stop) > MAX_STOPS:
        raise ApiError(400, f"stop has {len(stop)} strings; at most {MAX_STOPS} are allowed.",
                       "stop")
    prediction = req.prediction.text if req.prediction is not None else None
    return Sampling(max_tokens, float(temperature), float(top_p), int(top_k), req.seed,
                    stop, penalties, prediction,   # empty stop strings: TextStream ignores them
                    _logprobs(req), req.response_format, req.suffix_drafts)


def _logprobs(req: CompletionRequest | ChatCompletionRequest) -> int | None:
    """How many alternatives per token a request asks for, None for no logprobs: completions'
    `logprobs: N` (0..5), chat's `logprobs: true` with `top_logprobs: N` (0..20)."""
    if isinstance(req, CompletionRequest):
        if req.logprobs is not None and not 0 <= req.logprobs <= MAX_COMPLETION_LOGPROBS:
            raise ApiError(400, f"logprobs={req.logprobs} must be in [0, "
                                f"{MAX_COMPLETION_LOGPROBS}].", "logprobs")
        return req.logprobs
    top = req.top_logprobs
    if top is not None and not 0 <= top <= MAX_CHAT_LOGPROBS:
        raise ApiError(400, f"top_logprobs={top} must be in [0, {MAX_CHAT_LOGPROBS}].",
                       "top_logprobs")
    if not req.logprobs:
        if top:
            raise ApiError(400, "top_logprobs needs logprobs: true.", "top_logprobs")
        return None
    return top or 0


def _logit_bias(raw: dict[str, float]) -> dict[int, float]:
    """OpenAI's {"token id": bias} -> {id: bias}; the generator checks ids against the vocab."""
    out = {}
    for key, bias in raw.items():
        if not (key.isascii() and key.isdigit()):     # "²" and "١" are digits to isdigit()
            raise ApiError(400, f"logit_bias: key {key!r} must be a token id (digits).",
                           "logit_bias")
        if not -100 <= bias <= 100:
            raise ApiError(400, f"logit_bias[{key}]={bias} must be in [-100, 100].", "logit_bias")
        out[int(key)] = float(bias)
    return out


def _or(value: float | None, default: float) -> float:
    return default if value is None else float(value)


def single_prompt(prompt: str | list[int] | list[str] | list[list[int]]) -> str | list[int]:
    """The one prompt of a completion request: a string or token ids (batches are refused)."""
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
        if len(prompt) != 1:
            raise ApiError(400, f"prompt holds {len(prompt)} prompts; this server takes one per "
                                f"request. ---> HINT: send them as separate requests.", "prompt")
        prompt = prompt[0]
    if not prompt:
        raise ApiError(400, "the prompt is empty: give at least one character or token id.",
                       "prompt")
    return prompt


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def usage_body(result: GenerationResult) -> dict[str, Any]:
    """OpenAI's usage, with `completion_tokens_details` counting the prediction's tokens the
    target accepted and rejected when they were drafted (0 without a prediction), and this
    request's draft tokens and how many passed (extensions, in every answer: docs/serving.md)."""
    s = result.stats
    prompt, completion = s.prompt_tokens, len(result.token_ids)
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "completion_tokens_details": {
                "accepted_prediction_tokens": s.prediction_accepted,
                "rejected_prediction_tokens": s.prediction_drafted - s.prediction_accepted},
            "draft_tokens": s.drafted, "accepted_draft_tokens": s.accepted,
            "acceptance_rate": s.acceptance_rate}


def speculative_body(result: GenerationResult, replica: str) -> dict[str, Any]:
    """The `speculative` extension: this request's draft/verify statistics."""
    s = result.stats
    verdicts = s.verdicts.as_dict()
    return {"k": s.k, "acceptance_rate": s.acceptance_rate,
            "mean_accepted_per_round": s.mean_accepted_per_round, "rounds": s.rounds,
            "tokens_per_s": s.tokens_per_s, "drafted": s.drafted, "accepted": s.accepted,
            "lookup_drafted": s.lookup_drafted, "lookup_accepted": s.lookup_accepted,
            "earlier_drafted": s.earlier_drafted, "earlier_accepted": s.earlier_accepted,
            "forced": s.forced, "backend": s.backend, "replica": replica,
            # draft trees (docs/design.md §5): nodes verified a round and acceptance by depth
            # and rank (a chain's rounds count as depth j, rank 0)
            "nodes_per_round": s.nodes_per_round, "tree_rounds": s.tree_rounds,
            "acceptance_by_depth": verdicts["acceptance_by_depth"],
            "acceptance_by_rank": verdicts["acceptance_by_rank"]}


def completion_body(rid: str, model: str, result: GenerationResult, replica: str,
                    chat: bool, logprobs: dict[str, Any] | None = None) -> dict[str, Any]:
    finish = FINISH_REASON.get(result.stop_reason, "stop")
    choice: dict[str, Any] = {"index": 0, "finish_reason": finish, "logprobs": logprobs}
    if chat:
        choice["message"] = {"role": "assistant", "content": result.text}
    else:
        choice["text"] = result.text
    return {"id": rid, "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()), "model": model, "choices": [choice],
            "usage": usage_body(result), "speculative": speculative_body(result, replica)}


def chunk_body(rid: str, model: str, chat: bool, text: str | None = None,
               result: GenerationResult | None = None, replica: str = "",
               role: bool = False, logprobs: dict[str, Any] | None = None) -> dict[str, Any]:
    """One streamed chunk: a text piece, the role opener (chat), or the finish chunk."""
    choice: dict[str, Any] = {"index": 0, "finish_reason": None, "logprobs": logprobs}
    if chat:
        choice["delta"] = {"role": "assistant", "content": ""} if role else \
            ({"content": text} if text is not None else {})
    else:
        choice["text"] = text or ""
    body = {"id": rid, "object": "chat.completion.chunk" if chat else "text_completion",
            "created": int(time.time()), "model": model, "choices": [choice]}
    if result is not None:
        choice["finish_reason"] = FINISH_REASON.get(result.stop_reason, "stop")
        body["speculative"] = speculative_body(result, replica)
    return body


def usage_chunk(rid: str, model: str, chat: bool, result: GenerationResult) -> dict[str, Any]:
    """The extra last chunk that `stream_options.include_usage` asks for."""
    return {"id": rid, "object": "chat.completion.chunk" if chat else "text_completion",
            "created": int(time.time()), "model": model, "choices": [],
            "usage": usage_body(result)}


def sse(data: dict[str, Any] | str) -> bytes:
    """One server-sent event: `data: <json>` and a blank line."""
    payload = data if isinstance(data, str) else \
        json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return f"data: {payload}\n\n".encode()


def _check_unsupported(extra: dict[str, Any]) -> None:
    for name, allowed in UNSUPPORTED_DEFAULTS.items():
        if name in extra and extra[name] not in allowed:
            raise ApiError(400, f"{name}={extra[name]!r} is not supported by this server; leave it "
                                f"out or set it to {allowed[-1]!r}.", name, "unsupported_parameter")


def _from_validation(exc: ValidationError) -> ApiError:
    first = exc.errors()[0]
    loc = [str(part) for part in first["loc"]]
    param = loc[0] if loc else None
    if first["type"] == "missing":
        return ApiError(400, f"'{'.'.join(loc)}' is a required field.", param)
    shown = repr(first.get("input"))
    shown = shown if len(shown) <= 80 else shown[:77] + "..."
    if param in FIELD_SHAPES and (len(loc) == 1 or param in ("prompt", "stop")):
        return ApiError(400, f"'{param}' must be {FIELD_SHAPES[param]}; got {shown}.", param)
    return ApiError(400, f"'{'.'.join(loc)}': {first['msg']}; got {shown}.", param)
