"""Client of the Tokenizer Heterogeneity Layer (THL): `AlignClient`, blocking.

    with AlignClient("localhost:50052", token=TOKEN) as thl:
        a = thl.align("smollm2", peer_ids, "gpt2", traces={"logprobs": peer_logprobs})
        learn(a.target_ids, a.traces["logprobs"])          # the response in gpt2 ids, log-probs moved onto them
        if not a.lossless:
            log(a.residual)                                # what the alignment could not carry over
        batch = thl.align_batch([AlignJob("smollm2", ids, "gpt2", {"logprobs": lp}) for ids, lp in rollouts])

`source_ids` are the ids the peer *generated* (never a re-encoding). Each trace is moved with the
reduction `reductions` names for it: "sum" (the default, as the proto's UNSPECIFIED: log-probs,
each chunk's sum on its last target token), "all" (masks), "mean" (advantages) or "broadcast"
(sequence-level values). Trace values travel as float32.

`Aligned.target_ids` and its traces are the response's only: the target prompt ids the request
joined at the id level (the wire's `target_ids[:response_start]`) are left out.

Every call is stateless and idempotent, so it is retried with exponential backoff while the
service is UNAVAILABLE; other gRPC errors become `mrl.errors` exceptions (an unknown tokenizer id,
a token id outside a vocabulary, a trace of the wrong length: InvalidArgument). `align_batch`
sends at most `max_batch` alignments and `max_batch_ids` source ids per AlignBatch RPC, within the
service's defaults (MRL_MAX_BATCH 512, MRL_MAX_BATCH_IDS 262144); one alignment holds at most
MRL_MAX_IDS (32768) source ids and MRL_MAX_TRACES (16) traces.
"""
import dataclasses
from collections.abc import Iterable, Mapping, Sequence

from mrl import errors
from mrl.grpc_client import Backoff, BlockingClient, Connection, call
from mrl.v1 import tokenizer_align_pb2 as tpb
from mrl.v1 import tokenizer_align_pb2_grpc

__all__ = ["AlignClient", "AlignJob", "Aligned", "Backoff"]

REDUCTIONS = {"sum": tpb.TRACE_REDUCTION_SUM, "all": tpb.TRACE_REDUCTION_ALL, "mean": tpb.TRACE_REDUCTION_MEAN,
              "broadcast": tpb.TRACE_REDUCTION_BROADCAST}


@dataclasses.dataclass(frozen=True)
class AlignJob:
    """One alignment of `align_batch` (a dict with these keys does as well)."""

    source_tokenizer_id: str
    source_ids: Sequence[int]
    target_tokenizer_id: str
    traces: Mapping[str, Sequence[float]] | None = None
    target_prompt_ids: Sequence[int] = ()
    reductions: Mapping[str, str] | None = None  # trace name -> "sum" | "all" | "mean" | "broadcast" (default sum)


@dataclasses.dataclass(frozen=True)
class Aligned:
    """A response in the target's tokens (the prompt ids left out) and what the alignment cost."""

    target_ids: list[int]
    traces: dict[str, list[float]]               # each: one value per id of target_ids
    text: str                                    # the decoded response (its valid UTF-8)
    residual: tpb.ResidualReport                 # chunks, 1:1 shares, dropped bytes and specials, ...
    lossless: bool
    source_chunk: list[int]                      # chunk index of each source id
    target_chunk: list[int]                      # chunk index of each id of target_ids

    @classmethod
    def from_proto(cls, r: tpb.AlignResponse) -> "Aligned":
        return cls(target_ids=list(r.target_ids[r.response_start:]),
                   traces={t.name: list(t.values) for t in r.traces}, text=r.text, residual=r.residual,
                   lossless=r.residual.lossless, source_chunk=list(r.source_chunk), target_chunk=list(r.target_chunk))


def align_request(source_tokenizer_id: str, source_ids: Sequence[int], target_tokenizer_id: str,
                  traces: Mapping[str, Sequence[float]] | None = None, target_prompt_ids: Sequence[int] = (),
                  reductions: Mapping[str, str] | None = None) -> tpb.AlignRequest:
    """The AlignRequest of one alignment; InvalidArgument for ids or values protobuf cannot hold."""
    traces, reductions = traces or {}, reductions or {}
    unknown = sorted(set(reductions) - set(traces))
    if unknown:
        raise errors.InvalidArgument(f"reductions name traces that are not given: {', '.join(unknown)}")
    for name, reduction in reductions.items():
        if reduction not in REDUCTIONS:
            raise errors.InvalidArgument(f"trace {name!r}: reduction {reduction!r} must be one of "
                                         f"{', '.join(REDUCTIONS)}")
    try:
        return tpb.AlignRequest(
            source_tokenizer_id=source_tokenizer_id, source_ids=source_ids, target_tokenizer_id=target_tokenizer_id,
            target_prompt_ids=target_prompt_ids,
            traces=[tpb.Trace(name=name, values=values, reduction=REDUCTIONS[reductions.get(name, "sum")])
                    for name, values in traces.items()])
    except (TypeError, ValueError) as exc:  # a negative or non-integral id, a non-number value
        raise errors.InvalidArgument(f"cannot build the AlignRequest ({source_tokenizer_id} -> "
                                     f"{target_tokenizer_id}): {exc}") from None


def _job_request(job: "AlignJob | Mapping") -> tpb.AlignRequest:
    if isinstance(job, AlignJob):
        job = {f.name: getattr(job, f.name) for f in dataclasses.fields(job)}
    if not isinstance(job, Mapping):
        raise errors.InvalidArgument(f"an alignment of a batch must be an AlignJob or a dict, not {type(job).__name__}")
    try:
        return align_request(**job)
    except TypeError as exc:  # a missing or unknown key
        raise errors.InvalidArgument(f"alignment {dict(job)!r:.200}: {exc}") from None


class AlignClient(BlockingClient):
    def __init__(self, target: str, token: str | None = None, *, tls_root_cert: bytes | None = None,
                 max_message_bytes: int = 16 << 20, backoff: Backoff | None = None, timeout_s: float | None = None,
                 token_source: str | None = None, target_source: str | None = None):
        """`timeout_s` bounds each RPC (DeadlineExceeded, not retried); None: no deadline. `token` and
        `token_source`, `target_source` as ExchangeClient's."""
        self._connection = Connection("tokenizer alignment service", target, token, tls_root_cert, max_message_bytes,
                                      token_source=token_source, target_source=target_source)
        self._stub = tokenizer_align_pb2_grpc.TokenizerAlignStub(self._connection.channel)
        self.backoff = backoff or Backoff()
        self.timeout_s = timeout_s

    def _call(self, method, request):
        return call(method, request, self._connection, self.backoff, retry=True, timeout=self.timeout_s)

    def align(self, source_tokenizer_id: str, source_ids: Sequence[int], target_tokenizer_id: str,
              traces: Mapping[str, Sequence[float]] | None = None, target_prompt_ids: Sequence[int] = (), *,
              reductions: Mapping[str, str] | None = None) -> Aligned:
        """One response moved from the source tokenizer's ids onto the target's (one Align RPC)."""
        req = align_request(source_tokenizer_id, source_ids, target_tokenizer_id, traces, target_prompt_ids,
                            reductions)
        return Aligned.from_proto(self._call(self._stub.Align, req))

    def align_batch(self, jobs: Iterable["AlignJob | Mapping"], *, max_batch: int = 256,
                    max_batch_ids: int = 262_144) -> list[Aligned]:
        """Each job aligned, in order; AlignBatch RPCs of at most `max_batch` jobs and `max_batch_ids`
        source ids each (a single job over `max_batch_ids` goes alone, for the service to judge)."""
        if max_batch < 1 or max_batch_ids < 1:
            raise errors.InvalidArgument(f"max_batch ({max_batch}) and max_batch_ids ({max_batch_ids}) must be >= 1")
        requests = [_job_request(j) for j in jobs]  # all checked before anything is sent
        out: list[Aligned] = []
        for part in _split(requests, max_batch, max_batch_ids):
            reply = self._call(self._stub.AlignBatch, tpb.AlignBatchRequest(requests=part))
            out.extend(Aligned.from_proto(r) for r in reply.responses)
        return out

    def tokenizers(self) -> list[tpb.TokenizerInfo]:
        """The tokenizers the service holds: id, family, vocab size, byte-exactness, content hash."""
        return list(self._call(self._stub.ListTokenizers, tpb.ListTokenizersRequest()).tokenizers)


def _split(requests: list[tpb.AlignRequest], max_batch: int, max_batch_ids: int):
    part: list[tpb.AlignRequest] = []
    ids = 0
    for r in requests:
        n = len(r.source_ids)
        if part and (len(part) >= max_batch or ids + n > max_batch_ids):
            yield part
            part, ids = [], 0
        part.append(r)
        ids += n
    if part:
        yield part
