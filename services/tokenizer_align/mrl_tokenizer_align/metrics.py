"""Prometheus metrics of the alignment service."""
from prometheus_client import CollectorRegistry, Counter, Histogram

__all__ = ["AlignMetrics"]


class AlignMetrics:
    def __init__(self):
        self.registry = r = CollectorRegistry()
        self.alignments = Counter("mrl_align_alignments", "Responses aligned", ["source", "target", "lossless"],
                                  registry=r)
        self.tokens = Counter("mrl_align_source_tokens", "Source tokens aligned", ["source", "target"], registry=r)
        self.one_to_one = Histogram("mrl_align_one_to_one_share", "Share of 1:1 chunks per response",
                                    buckets=(.5, .7, .8, .9, .95, .99, 1.0), registry=r)

    def observe(self, source: str, target: str, n_tokens: int, residual) -> None:
        self.alignments.labels(source, target, str(residual.lossless).lower()).inc()
        self.tokens.labels(source, target).inc(n_tokens)
        self.one_to_one.observe(residual.one_to_one_share)
