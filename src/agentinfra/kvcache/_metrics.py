"""Prometheus metrics of the cache server and a tiny ``/metrics`` HTTP endpoint.

Names follow vLLM's prefix-cache metrics where they mean the same thing
(``vllm:prefix_cache_queries`` / ``vllm:prefix_cache_hits`` count tokens; ours
count blocks, hence the ``_blocks`` suffix). Store and tier counters are read
from `TieredStore.stats` at scrape time, so they are never counted twice.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from agentinfra.kvcache._store import TieredStore

__all__ = ["CONTENT_TYPE", "ServerMetrics", "serve_metrics"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_PREFIX = "agentinfra_kv"


class _StoreCollector(Collector):
    def __init__(self, store: TieredStore) -> None:
        self._store = store

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        stats = self._store.stats()
        misses = CounterMetricFamily(
            f"{_PREFIX}_misses", "Lookups that stopped short, by the first missing block's reason",
            labels=["reason"],
        )  # fmt: skip
        for reason, count in sorted(stats.misses_by_reason.items()):
            misses.add_metric([reason], count)
        yield misses
        for name, value, doc in (
            ("lookups", stats.lookups, "Store lookups (GET batches)"),
            ("promotions", stats.promotions, "Blocks promoted into memory from a lower tier"),
            ("demotions", stats.demotions, "Blocks demoted from memory to disk"),
            ("dropped", stats.dropped, "Blocks evicted from memory without demotion"),
        ):
            yield CounterMetricFamily(f"{_PREFIX}_{name}", doc, value=value)
        yield GaugeMetricFamily(
            f"{_PREFIX}_quarantined_blocks",
            "Blocks that failed a checksum",
            value=stats.quarantined,
        )
        yield GaugeMetricFamily(
            f"{_PREFIX}_sessions_active", "Agent sessions in a turn", value=stats.sessions_active
        )
        per_tier: dict[str, tuple[type[CounterMetricFamily] | type[GaugeMetricFamily], str]] = {
            "blocks": (GaugeMetricFamily, "Blocks held"),
            "used_bytes": (GaugeMetricFamily, "Bytes held"),
            "capacity_bytes": (GaugeMetricFamily, "Byte capacity"),
            "hits": (CounterMetricFamily, "Block reads that found the block"),
            "misses": (CounterMetricFamily, "Block reads that did not"),
            "evictions": (CounterMetricFamily, "Blocks evicted by the tier's policy"),
            "bytes_read": (CounterMetricFamily, "Bytes read out of the tier"),
            "bytes_written": (CounterMetricFamily, "Bytes written into the tier"),
        }
        for field, (kind, doc) in per_tier.items():
            family = kind(f"{_PREFIX}_tier_{field}", doc, labels=["tier"])
            for tier in stats.tiers:
                family.add_metric([tier.name], getattr(tier, field))
            yield family


class ServerMetrics:
    """The server's metrics in their own registry (many servers may share a process)."""

    def __init__(self, store: TieredStore) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.queries = Counter(
            f"{_PREFIX}_prefix_cache_queries_blocks",
            "Blocks asked for by LEADING_HITS and GET",
            registry=r,
        )
        self.hits = Counter(
            f"{_PREFIX}_prefix_cache_hits_blocks", "Blocks returned by GET", registry=r
        )
        self.connections = Gauge(f"{_PREFIX}_connections", "Open client connections", registry=r)
        self.requests = Counter(
            f"{_PREFIX}_requests", "Requests by opcode and status", ["op", "status"], registry=r
        )
        self.latency = Histogram(
            f"{_PREFIX}_request_seconds", "Time from a request's arrival to its response", ["op"], registry=r,
            buckets=(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
        )  # fmt: skip
        self.bytes_received = Counter(
            f"{_PREFIX}_server_received_bytes", "Bytes received from clients", registry=r
        )
        self.bytes_sent = Counter(
            f"{_PREFIX}_server_sent_bytes", "Bytes sent to clients", registry=r
        )
        self.shm_bytes = Counter(
            f"{_PREFIX}_server_shm_written_bytes",
            "Bytes of GET_SHM answers written into clients' shared segments",
            registry=r,
        )
        self.shm_segments = Gauge(
            f"{_PREFIX}_shm_segments", "Clients' shared segments mapped", registry=r
        )
        r.register(_StoreCollector(store))

    def render(self) -> bytes:
        return generate_latest(self.registry)


async def serve_metrics(metrics: ServerMetrics, host: str, port: int) -> asyncio.Server:
    """Serves ``GET /metrics`` (HTTP/1.1, one request per connection) on ``host:port``."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5.0)
            line = request.split(b"\r\n", 1)[0].split()
            if len(line) >= 2 and line[0] == b"GET" and line[1].split(b"?")[0] == b"/metrics":
                # off the loop: reading the store's counters waits for its lock
                body = await asyncio.to_thread(metrics.render)
                status, kind = b"200 OK", CONTENT_TYPE.encode()
            else:
                body, status, kind = b"not found; try /metrics\n", b"404 Not Found", b"text/plain"
            writer.write(
                b"HTTP/1.1 " + status + b"\r\nContent-Type: " + kind
                + b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n"
                + body
            )  # fmt: skip
            await writer.drain()
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, OSError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    return await asyncio.start_server(handle, host, port)
