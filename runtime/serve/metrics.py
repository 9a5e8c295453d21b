"""Server metrics in the Prometheus text format (version 0.0.4), no client library.

Updated from the event loop only, so no locks. One `Metrics` per process: under
Ray Serve each replica keeps its own (GET /metrics answers for one replica).
"""
from __future__ import annotations

import bisect
from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..request import GenerationResult

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


@dataclass
class Histogram:
    buckets: tuple[float, ...] = LATENCY_BUCKETS
    counts: list[int] = field(default_factory=list)     # per bucket, not cumulative
    total: float = 0.0
    n: int = 0

    def observe(self, value: float) -> None:
        if not self.counts:
            self.counts = [0] * (len(self.buckets) + 1)  # the last one is +Inf
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.total += value
        self.n += 1

    def lines(self, name: str, labels: str = "") -> list[str]:
        counts = self.counts or [0] * (len(self.buckets) + 1)
        out, running = [], 0
        for bound, count in zip([*map(repr, self.buckets), "+Inf"], counts, strict=True):
            running += count
            le = f'le="{bound}"'
            out.append(f"{name}_bucket{{{_join(labels, le)}}} {running}")
        suffix = f"{{{labels}}}" if labels else ""
        return [*out, f"{name}_sum{suffix} {self.total!r}", f"{name}_count{suffix} {self.n}"]


BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64)


class Metrics:
    def __init__(self, model: str, replica: str) -> None:
        self.base = f'model="{_escape(model)}",replica="{_escape(replica)}"'
        self.requests: dict[tuple[str, int], int] = defaultdict(int)
        self.latency: dict[str, Histogram] = defaultdict(Histogram)
        self.queue_wait, self.first_token = Histogram(), Histogram()
        self.inter_token = Histogram()          # between a request's text pieces (batched)
        self.batch_size = Histogram(BATCH_BUCKETS)   # sequences per round (batched)
        self.prompt_tokens = self.generated_tokens = self.drafted = self.accepted = 0
        self.decode_seconds = 0.0
        self.last_tokens_per_s = 0.0
        self.mean_service_s = 0.0     # moving average of the time one request holds the generator

    def observe_request(self, endpoint: str, status: int, seconds: float) -> None:
        self.requests[endpoint, status] += 1
        self.latency[endpoint].observe(seconds)

    def observe_generation(self, result: GenerationResult) -> None:
        s = result.stats
        self.prompt_tokens += s.prompt_tokens
        self.generated_tokens += len(result.token_ids)
        self.drafted += s.drafted
        self.accepted += s.accepted
        self.decode_seconds += s.seconds["decode"]
        self.last_tokens_per_s = s.tokens_per_s

    def observe_service(self, seconds: float) -> None:
        self.mean_service_s = seconds if not self.mean_service_s else \
            0.9 * self.mean_service_s + 0.1 * seconds

    def render(self, queue_depth: int, busy: bool) -> str:
        b = self.base
        rate = self.generated_tokens / self.decode_seconds if self.decode_seconds else 0.0
        accept = self.accepted / self.drafted if self.drafted else 0.0
        out = _family("ssd_requests_total", "counter", "HTTP requests answered, by endpoint and "
                      "status (499: the client went away).",
                      [f'ssd_requests_total{{{b},endpoint="{e}",status="{s}"}} {n}'
                       for (e, s), n in sorted(self.requests.items())])
        out += _scalar("ssd_prompt_tokens_total", "counter", "Prompt tokens processed.",
                       b, self.prompt_tokens)
        out += _scalar("ssd_generated_tokens_total", "counter", "Completion tokens generated.",
                       b, self.generated_tokens)
        out += _scalar("ssd_draft_tokens_total", "counter", "Draft tokens proposed.", b,
                       self.drafted)
        out += _scalar("ssd_accepted_tokens_total", "counter", "Draft tokens the target accepted.",
                       b, self.accepted)
        out += _scalar("ssd_decode_seconds_total", "counter", "Seconds spent decoding.", b,
                       self.decode_seconds)
        out += _scalar("ssd_acceptance_rate", "gauge", "Accepted / drafted over all requests.",
                       b, accept)
        out += _scalar("ssd_tokens_per_second", "gauge", "Generated tokens / decode seconds over "
                       "all requests.", b, rate)
        out += _scalar("ssd_last_tokens_per_second", "gauge", "Decode speed of the last request.",
                       b, self.last_tokens_per_s)
        out += _scalar("ssd_queue_depth", "gauge", "Requests waiting for the generator.", b,
                       queue_depth)
        out += _scalar("ssd_busy", "gauge", "1 while a request holds the generator.", b, int(busy))
        out += _family("ssd_request_latency_seconds", "histogram", "Request latency, arrival to "
                       "last byte, by endpoint.",
                       [line for e, h in sorted(self.latency.items())
                        for line in h.lines("ssd_request_latency_seconds", f'{b},endpoint="{e}"')])
        out += _family("ssd_queue_wait_seconds", "histogram", "Time spent waiting for the "
                       "generator.", self.queue_wait.lines("ssd_queue_wait_seconds", b))
        out += _family("ssd_time_to_first_token_seconds", "histogram", "Arrival to the first "
                       "text piece.", self.first_token.lines("ssd_time_to_first_token_seconds", b))
        out += _family("ssd_inter_token_seconds", "histogram", "Time between a request's "
                       "text pieces (--max-batch > 1).",
                       self.inter_token.lines("ssd_inter_token_seconds", b))
        out += _family("ssd_batch_size", "histogram", "Sequences decoded per round "
                       "(--max-batch > 1).", self.batch_size.lines("ssd_batch_size", b))
        return "\n".join(out) + "\n"


def _family(name: str, kind: str, help_text: str, lines: list[str]) -> list[str]:
    return [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}", *lines]


def _scalar(name: str, kind: str, help_text: str, labels: str, value: float) -> list[str]:
    return _family(name, kind, help_text, [f"{name}{{{labels}}} {value!r}"])


def _join(*labels: str) -> str:
    return ",".join(part for part in labels if part)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
