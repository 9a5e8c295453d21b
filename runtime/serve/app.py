"""The ASGI app of `ssd-serve`: OpenAI routes over one `Generator`.

    app = create_app(ServeConfig(bundle="bundle/"))   # then uvicorn, or a Ray Serve replica
    POST /v1/completions, POST /v1/chat/completions (both with stream: true as SSE),
    GET /v1/models, GET /health, GET /metrics (Prometheus text)
With API keys (config.api_keys) every route but /health (and /metrics if metrics_open)
answers 401 before it runs unless the request carries one; its id goes to Request.tenant.
"""
from __future__ import annotations

import logging
import time
from contextlib import aclosing, asynccontextmanager
from time import perf_counter
from typing import Any, AsyncIterator, Callable

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..errors import SsdError
from ..generator import Generator
from .chat import ChatTemplate
from .config import ServeConfig, resolve_k
from .keys import ApiKeys, bearer_token
from .batching import BatchEngine, BatchTicket, ClientGone, Job, choose_slots
from ..round.logprobs import Logprobs, TokenLogprob
from .logprobs import TokenNames, chat_logprobs, completion_logprobs
from .metrics import CONTENT_TYPE, Metrics
from .protocol import (ApiError, ChatCompletionRequest, CompletionRequest, Sampling, chunk_body,
                       completion_body, error_body, new_id, parse_request, sampling, single_prompt,
                       sse, usage_chunk)

log = logging.getLogger("ssd_runtime.serve")
REPLICA_HEADER = "x-ssd-replica"
ROUTES = ("/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/metrics")
COMPLETIONS_DEFAULT_MAX_TOKENS = 16     # as the OpenAI completions API
CLIENT_GONE = 499                       # status recorded when the client disconnects
OPEN_PATHS = frozenset({"/health"})     # answered without a key when the server has keys


class Server:
    """What the routes share: the generator, its engine, the metrics and the limits."""

    def __init__(self, config: ServeConfig, generator: Generator, replica: str) -> None:
        self.config, self.generator, self.replica = config, generator, replica
        self.model = config.served_name
        self.k = resolve_k(config.k, generator.manifest.max_draft)
        self.max_context = generator.manifest.max_context
        self.max_tokens_limit = config.max_tokens_limit or self.max_context
        self.metrics = Metrics(self.model, replica)
        self.max_batch = generator.max_batch if config.max_batch is not None \
            else choose_slots(generator, self.k)
        self.engine = BatchEngine(generator, self.k, config.max_queue, self.metrics,
                                  self.max_batch)
        self.chat = ChatTemplate(generator)
        self.names = TokenNames(generator.codec)
        self.created = int(time.time())

    def sampling(self, req: CompletionRequest | ChatCompletionRequest, default: int) -> Sampling:
        return sampling(req, self.model, self.max_tokens_limit, default,
                        self.generator.defaults(openai=True))

    def prompt_ids(self, prompt: str | list[int], param: str) -> list[int]:
        try:
            ids = self.generator.encode(prompt) if isinstance(prompt, str) else list(prompt)
        except SsdError as exc:                  # text that is not valid Unicode
            raise ApiError(400, str(exc), param) from None
        if len(ids) > self.max_context:
            raise ApiError(400, f"the prompt has {len(ids)} tokens, more than this model's context "
                                f"of {self.max_context} tokens. ---> HINT: shorten the prompt.",
                           param, "context_length_exceeded")
        return ids

    def prediction_ids(self, text: str, prompt_len: int) -> list[int]:
        """The prediction tokenised once; longer than the context leaves after the prompt, a
        400 naming it (it could never be emitted whole)."""
        try:
            ids = self.generator.codec.tokens(text) if text else []   # no BOS: output text
        except SsdError as exc:
            raise ApiError(400, f"prediction: {exc}", "prediction") from None
        room = self.max_context - prompt_len
        if len(ids) > room:
            raise ApiError(400, f"prediction has {len(ids)} tokens, more than the {room} this "
                                f"model's context of {self.max_context} tokens leaves after the "
                                f"prompt's {prompt_len}. ---> HINT: predict only the part of the "
                                f"output you expect, or shorten the prompt.",
                           "prediction", "context_length_exceeded")
        return ids

    async def respond(self, request: Request, ids: list[int], opts: Sampling, stream: bool,
                      include_usage: bool, chat: bool) -> Response:
        """Validate, take a place in the queue (or 429), then answer as JSON or as SSE."""
        source = self.config.draft_source
        if not opts.suffix_drafts:                       # neither reads nor joins them
            source = {"suffix": "lookup", "fused+suffix": "fused"}.get(source, source)
        options = {**opts.options(self.k), "draft_source": source,
                   "tenant": getattr(request.state, "tenant", None)}   # _KeyMiddleware's
        if opts.prediction is not None:
            options["prediction"] = self.prediction_ids(opts.prediction, len(ids))
        collected = None
        if opts.logprobs is not None:        # filled by the rounds, read as pieces go out
            collected = options["logprobs"] = Logprobs(opts.logprobs)
        if opts.response_format is not None:     # compiled once, checked here (400)
            try:
                options["response_format"] = self.generator.constraint(opts.response_format)
            except SsdError as exc:
                raise ApiError(400, str(exc), "response_format") from None
        try:
            pieces = self.engine.prepare(ids, options)      # validates eagerly
        except SsdError as exc:
            raise ApiError(400, str(exc), "response_format" if "response_format" in str(exc)
                           else None) from None
        ticket = self.engine.enter(pieces)
        rid = new_id("chatcmpl" if chat else "cmpl")
        if stream:
            events = self._events(request, ticket, pieces, rid, chat, include_usage, collected)
            return _EventStream(events, on_close=lambda: self.engine.finish(ticket, pieces))
        return await self._complete(request, ticket, pieces, rid, chat)

    def logprobs_body(self, tokens: list[TokenLogprob] | None, chat: bool,
                      offset: int = 0) -> dict[str, Any] | None:
        if tokens is None:
            return None
        return chat_logprobs(tokens, self.names) if chat else \
            completion_logprobs(tokens, self.names, offset)

    async def _complete(self, request: Request, ticket: BatchTicket, pieces: Job, rid: str,
                        chat: bool) -> Response:
        """A non-streamed answer; the client is polled so that leaving stops the generation."""
        try:
            async with aclosing(self.engine.run(ticket, pieces, request.is_disconnected)) as run:
                async for _ in run:
                    pass
        except ClientGone:
            request.state.status = CLIENT_GONE
            return Response(status_code=CLIENT_GONE)
        finally:
            self.engine.finish(ticket, pieces)
        result = ticket.result
        assert result is not None
        return JSONResponse(completion_body(rid, self.model, result, self.replica, chat,
                                            self.logprobs_body(result.logprobs, chat)))

    async def _events(self, request: Request, ticket: BatchTicket, pieces: Job, rid: str,
                      chat: bool, include_usage: bool,
                      collected: Logprobs | None = None) -> AsyncIterator[bytes]:
        """The SSE body: role chunk (chat), one chunk per piece, finish chunk, [DONE]. With
        logprobs, a piece's chunk carries those of the tokens decoded since the last chunk
        (the rounds add them as they emit), the finish chunk the rest the result keeps."""
        done, sent, offset = False, 0, 0
        try:
            if chat:
                yield sse(chunk_body(rid, self.model, chat, role=True))
            async with aclosing(self.engine.run(ticket, pieces)) as run:
                async for piece in run:
                    logprobs = None
                    if collected is not None:
                        new = collected.tokens[sent:]
                        sent += len(new)
                        logprobs = self.logprobs_body(new, chat, offset)
                        if not chat and new:         # offsets run on over the tokens' texts
                            offset = logprobs["text_offset"][-1] + len(logprobs["tokens"][-1])
                    yield sse(chunk_body(rid, self.model, chat, text=piece, logprobs=logprobs))
            result = ticket.result
            rest = None if collected is None else \
                self.logprobs_body(collected.tokens[sent:len(result.token_ids)], chat, offset)
            yield sse(chunk_body(rid, self.model, chat, result=result, replica=self.replica,
                                 logprobs=rest))
            if include_usage:
                yield sse(usage_chunk(rid, self.model, chat, result))
            yield sse("[DONE]")
            done = True
        except Exception as exc:            # after the 200 header: report the failure in-band
            log.exception("generation failed")
            request.state.status, done = 500, True
            yield sse(error_body(f"generation failed: {exc}", "server_error"))
            yield sse("[DONE]")
        finally:
            if not done:
                request.state.status = CLIENT_GONE


class _EventStream(StreamingResponse):
    """An SSE response that always closes its body and frees the generator, even when
    the client left before the body was iterated."""

    def __init__(self, events: AsyncIterator[bytes], on_close: Callable[[], None]) -> None:
        super().__init__(events, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self.on_close = on_close

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.on_close()
            await self.body_iterator.aclose()


def create_app(config: ServeConfig, generator: Generator | None = None,
               replica: str = "local") -> FastAPI:
    """Load the bundle (unless a generator is given) and build the app; errors are SsdError."""
    generator = generator or _load(config)
    server = Server(config, generator, replica)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        server.engine.close()

    app = FastAPI(title="ssd-serve", version="0.1.0", lifespan=lifespan)
    app.state.server = server
    _add_routes(app, server)
    _add_error_handlers(app)
    if config.api_keys is not None:          # inside _ServerMiddleware: its 401s are counted
        open_paths = OPEN_PATHS | ({"/metrics"} if config.metrics_open else set())
        app.add_middleware(_KeyMiddleware, keys=config.api_keys, open_paths=open_paths)
    app.add_middleware(_ServerMiddleware, server=server)
    log.info("serving %s (%s backend, k=%s, max_batch=%d) from %s; %s", server.model,
             generator.backend, server.k, server.max_batch, config.bundle, _access(config))
    return app


def _load(config: ServeConfig) -> Generator:
    """The generator, with slots for --max-batch (unset: as many as the bundle was exported
    for, on the cpu backend; the server then keeps what the calibration says pays)."""
    from ..backends import plan, probe
    from ..manifest import read_manifest

    slots = config.max_batch or 1
    if config.max_batch is None and config.mode != "split":
        manifest = read_manifest(config.bundle, verify=False)
        facts = probe(manifest, config.backend, target_only=config.draft_backend == "cpu")
        if plan(config.backend, facts).attempts[0] == "cpu":
            slots = manifest.max_batch
    return Generator.load(config.bundle, config.backend, config.threads, mode=config.mode,
                          max_batch=slots, recalibrate=config.recalibrate,
                          draft_backend=config.draft_backend,
                          suffix_budget=int(config.suffix_cache_mb * (1 << 20)))


def _add_routes(app: FastAPI, server: Server) -> None:
    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        req = parse_request(await request.body(), CompletionRequest)
        opts = server.sampling(req, COMPLETIONS_DEFAULT_MAX_TOKENS)
        ids = server.prompt_ids(single_prompt(req.prompt), "prompt")
        return await server.respond(request, ids, opts, req.stream, _include_usage(req), chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        req = parse_request(await request.body(), ChatCompletionRequest)
        opts = server.sampling(req, server.max_tokens_limit)
        ids = server.prompt_ids(server.chat.prompt_ids(
            [m.as_template_input() for m in req.messages]), "messages")
        return await server.respond(request, ids, opts, req.stream, _include_usage(req), chat=True)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [_model_card(server)]}

    @app.get("/v1/models/{model:path}")
    async def model(model: str) -> dict[str, Any]:
        if model != server.model:
            raise ApiError(404, f"the model {model!r} does not exist; this server serves "
                                f"{server.model!r}.", "model", "model_not_found")
        return _model_card(server)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        placement = server.generator.placement      # CPU threads and where they came from
        return {"status": "ok", "model": server.model, "backend": server.generator.backend,
                "placement": placement.as_dict() if placement is not None else None,
                "k": server.k, "max_context": server.max_context, "replica": server.replica,
                "max_batch": server.max_batch,
                "queue_depth": server.engine.slot.depth, "busy": server.engine.slot.busy}

    @app.post("/reset_suffix_cache")
    async def reset_suffix_cache(request: Request) -> dict[str, Any]:
        """Forget earlier requests' text: the caller's API key's (everyone's without keys)."""
        tenant = getattr(request.state, "tenant", None)
        forgotten = server.generator.suffixes.clear(tenant)
        return {"status": "ok", "forgotten_requests": forgotten}

    @app.get("/metrics")
    async def metrics() -> Response:
        slot = server.engine.slot
        return PlainTextResponse(server.metrics.render(slot.depth, slot.busy),
                                 media_type=CONTENT_TYPE)


def _add_error_handlers(app: FastAPI) -> None:
    async def api_error(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, ApiError)
        return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)

    async def http_error(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return JSONResponse(error_body(str(exc.detail), kind), status_code=exc.status_code,
                            headers=exc.headers)

    async def internal_error(_: Request, exc: Exception) -> Response:
        log.exception("internal error", exc_info=exc)
        return JSONResponse(error_body(f"internal error: {exc}", "server_error"), status_code=500)

    app.add_exception_handler(ApiError, api_error)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(Exception, internal_error)


class _ServerMiddleware:
    """Counts every request by endpoint and status, times it, and names the replica."""

    def __init__(self, app: Any, server: Server) -> None:
        self.app, self.server = app, server
        self.header = (REPLICA_HEADER.encode(), server.replica.encode())

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        start, status = perf_counter(), [500]
        state = scope.setdefault("state", {})   # shared with the handler's request.state

        async def send_and_note(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
                message = {**message, "headers": [*message.get("headers", []), self.header]}
            await send(message)

        try:
            await self.app(scope, receive, send_and_note)
        finally:
            code = state.get("status", status[0])
            endpoint = scope["path"] if scope["path"] in ROUTES else "other"
            self.server.metrics.observe_request(endpoint, code, perf_counter() - start)


class _KeyMiddleware:
    """With API keys: a request without one of them is answered 401 here, before any route
    reads its body or the engine sees it; one with a key carries the key's id on
    request.state.tenant. Every path needs a key but `open_paths` (unknown ones too)."""

    def __init__(self, app: Any, keys: ApiKeys, open_paths: frozenset[str]) -> None:
        self.app, self.keys, self.open_paths = app, keys, open_paths

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] in self.open_paths:
            return await self.app(scope, receive, send)
        token = bearer_token(Headers(scope=scope).get("authorization"))
        tenant = self.keys.tenant(token)
        if tenant is None:
            return await _unauthorized(token is None)(scope, receive, send)
        scope.setdefault("state", {})["tenant"] = tenant
        return await self.app(scope, receive, send)


def _unauthorized(missing: bool) -> Response:
    """OpenAI's 401 (type invalid_request_error, code invalid_api_key), with RFC 6750's
    WWW-Authenticate; the message never repeats what the client sent."""
    if missing:
        message = ("no API key: this route needs `Authorization: Bearer <key>`. ---> HINT: "
                   "send the key the operator gave you (the openai client: api_key=..., or "
                   "$OPENAI_API_KEY).")
        challenge = 'Bearer realm="ssd-serve"'
    else:
        message = ("incorrect API key: the Bearer key sent is none of this server's keys. "
                   "---> HINT: check the key, or ask the operator for one.")
        challenge = 'Bearer realm="ssd-serve", error="invalid_token"'
    return JSONResponse(error_body(message, "invalid_request_error", None, "invalid_api_key"),
                        status_code=401, headers={"WWW-Authenticate": challenge})


def _access(config: ServeConfig) -> str:
    """Who may call, for the start-up line: how many keys, never a key."""
    if config.api_keys is None:
        return "no API keys: every route is open"
    open_paths = "/health and /metrics" if config.metrics_open else "/health"
    return f"{len(config.api_keys)} API keys: every route but {open_paths} needs one"


def _include_usage(req: CompletionRequest | ChatCompletionRequest) -> bool:
    return bool(req.stream_options and req.stream_options.include_usage)


def _model_card(server: Server) -> dict[str, Any]:
    return {"id": server.model, "object": "model", "created": server.created,
            "owned_by": "ssd-toolkit", "max_context": server.max_context, "k": server.k,
            "max_draft": server.generator.manifest.max_draft}
