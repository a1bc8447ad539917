"""The workers' metrics inside the router's /metrics, each series labelled by worker.

Under `pagoda serve` one scrape of the router answers for the whole
deployment: the router's own `pagoda_router_*` series, then every worker's
`vllm:*` series (fetched from `--worker-metrics-url` at scrape time) with a
`worker` label added, merged into one family per name, and
`pagoda_router_worker_metrics_up{worker}` saying which workers answered. A
cluster scraped by Prometheus directly needs none of this: it scrapes each
worker's --metrics-port.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from urllib.parse import urlsplit

import httpx
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from shared.logging import get_logger

logger = get_logger(__name__)

SCRAPE_TIMEOUT_S = 2.0


def parse_target(target: str) -> tuple[str, str]:
    """`[NAME=]URL` -> (the worker label, URL); the label defaults to URL's host:port."""
    name, sep, url = target.partition("=")
    if not sep or "://" in name:
        name, url = "", target
    return name or urlsplit(url).netloc, url


class _Families(Collector):
    def __init__(self, families: Iterable[Metric]) -> None:
        self._families = list(families)

    def collect(self) -> Iterable[Metric]:
        return self._families


class WorkerMetricsScraper:
    def __init__(self, targets: Iterable[str]) -> None:
        self.targets = [parse_target(t) for t in targets]

    @staticmethod
    async def _fetch(client: httpx.AsyncClient, url: str) -> str:
        response = await client.get(url)
        response.raise_for_status()
        return response.text

    async def render(self) -> bytes:
        """The workers' series in Prometheus text format (b"" with no targets)."""
        if not self.targets:
            return b""
        # A client per scrape: scrapes come seconds apart, and nothing is left to close.
        async with httpx.AsyncClient(timeout=SCRAPE_TIMEOUT_S) as client:
            answers = await asyncio.gather(
                *(self._fetch(client, url) for _, url in self.targets), return_exceptions=True
            )
        merged: dict[str, Metric] = {}
        up = GaugeMetricFamily(
            "pagoda_router_worker_metrics_up",
            "1 if the worker's metrics answered this scrape.",
            labels=["worker"],
        )
        for (worker, url), answer in zip(self.targets, answers):
            families = []
            if not isinstance(answer, BaseException):
                try:
                    families = list(text_string_to_metric_families(answer))
                except ValueError as exc:  # not Prometheus text: as good as no answer
                    answer = exc
            up.add_metric([worker], 0.0 if isinstance(answer, BaseException) else 1.0)
            if isinstance(answer, BaseException):
                logger.debug("worker metrics at %s: %s", url, answer)
                continue
            for family in families:
                into = merged.get(family.name)
                if into is None:
                    into = merged[family.name] = Metric(
                        family.name, family.documentation, family.type, family.unit
                    )
                for s in family.samples:
                    labels = {**s.labels, "worker": worker}
                    into.add_sample(s.name, labels, s.value, s.timestamp, s.exemplar)
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Families([*merged.values(), up]))
        return generate_latest(registry)
