"""The TokenizerAlign transports: gRPC servicer and REST twin, both thin over `align` and the registry.

Requests are checked against the limits (ids, traces, batch) before any work; CPU-bound
alignment runs in a worker thread so health checks and other calls stay responsive.
"""
import asyncio
import json

import numpy as np
from fastapi import Depends, FastAPI, Request
from google.protobuf import json_format

from mrl.auth import Authenticator
from mrl.errors import InvalidArgument
from mrl_serving.ratelimit import RateLimiter
from mrl_serving.server import grpc_principal, proto_json, rest_app, who_am_i
from mrl.v1 import tokenizer_align_pb2 as tpb
from mrl_tokenizer_align.align import Alignment, Trace, align
from mrl_tokenizer_align.metrics import AlignMetrics
from mrl_tokenizer_align.registry import TokenizerRegistry
from mrl_tokenizer_align.settings import AlignSettings
from mrl_tokenizer_align.vocab import shown

__all__ = ["Aligner", "AlignServicer", "create_rest_app"]

_REDUCTION = {tpb.TRACE_REDUCTION_UNSPECIFIED: "sum", tpb.TRACE_REDUCTION_SUM: "sum", tpb.TRACE_REDUCTION_ALL: "all",
              tpb.TRACE_REDUCTION_MEAN: "mean", tpb.TRACE_REDUCTION_BROADCAST: "broadcast"}
_REDUCTION_ENUM = {"sum": tpb.TRACE_REDUCTION_SUM, "all": tpb.TRACE_REDUCTION_ALL, "mean": tpb.TRACE_REDUCTION_MEAN,
                   "broadcast": tpb.TRACE_REDUCTION_BROADCAST}


class Aligner:
    """Protobuf in, protobuf out: the one place requests meet the core."""

    def __init__(self, registry: TokenizerRegistry, settings: AlignSettings):
        self.registry, self.settings = registry, settings
        self.metrics = AlignMetrics()

    def align(self, req: tpb.AlignRequest) -> tpb.AlignResponse:
        s = self.settings
        for what, n in (("source_ids", len(req.source_ids)), ("target_prompt_ids", len(req.target_prompt_ids))):
            if n > s.max_ids:
                raise InvalidArgument(f"{what} holds {n} ids; at most {s.max_ids} per alignment (MRL_MAX_IDS)")
        if len(req.traces) > s.max_traces:
            raise InvalidArgument(f"{len(req.traces)} traces; at most {s.max_traces} per alignment (MRL_MAX_TRACES)")
        src, dst = self.registry.get(req.source_tokenizer_id), self.registry.get(req.target_tokenizer_id)
        traces = []
        for t in req.traces:
            if t.reduction not in _REDUCTION:
                raise InvalidArgument(f"trace {shown(t.name)}: unknown reduction {t.reduction}; use SUM, ALL, "
                                      f"MEAN or BROADCAST")
            traces.append(Trace(t.name, np.asarray(t.values, dtype=np.float64), _REDUCTION[t.reduction]))
        result = align(src, np.asarray(req.source_ids, dtype=np.int64), dst, traces,
                       np.asarray(req.target_prompt_ids, dtype=np.int64))
        self.metrics.observe(src.tokenizer_id, dst.tokenizer_id, len(req.source_ids), result.residual)
        return _response(result)

    def align_batch(self, req: tpb.AlignBatchRequest) -> tpb.AlignBatchResponse:
        s = self.settings
        if len(req.requests) > s.max_batch:
            raise InvalidArgument(f"{len(req.requests)} alignments in one batch; at most {s.max_batch} (MRL_MAX_BATCH)")
        total = sum(len(r.source_ids) for r in req.requests)
        if total > s.max_batch_ids:
            raise InvalidArgument(f"the batch holds {total} source ids; at most {s.max_batch_ids} per AlignBatch "
                                  f"(MRL_MAX_BATCH_IDS), so that the answer fits one message: split it")
        out = tpb.AlignBatchResponse()
        for i, r in enumerate(req.requests):
            try:
                out.responses.append(self.align(r))
            except InvalidArgument as exc:
                raise InvalidArgument(f"requests[{i}]: {exc}") from None
        out.aggregate.CopyFrom(aggregate([r.residual for r in out.responses]))
        return out

    def register(self, req: tpb.RegisterTokenizerRequest) -> tpb.RegisterTokenizerResponse:
        return tpb.RegisterTokenizerResponse(tokenizer=_info(self.registry.register(req.tokenizer_id, req.path)))

    def list(self) -> tpb.ListTokenizersResponse:
        return tpb.ListTokenizersResponse(tokenizers=[_info(v) for v in self.registry.all()])


def _info(v) -> tpb.TokenizerInfo:
    return tpb.TokenizerInfo(tokenizer_id=v.tokenizer_id, family=v.family, vocab_size=v.vocab_size,
                             byte_exact=v.byte_exact, content_sha256=v.content_sha256)


def _response(a: Alignment) -> tpb.AlignResponse:
    r = a.residual
    return tpb.AlignResponse(
        target_ids=a.target_ids.tolist(), source_chunk=a.source_chunk.tolist(), target_chunk=a.target_chunk.tolist(),
        traces=[tpb.Trace(name=t.name, values=t.values.tolist(), reduction=_REDUCTION_ENUM[t.reduction])
                for t in a.traces],
        residual=tpb.ResidualReport(**vars(r)), text=a.text, response_start=a.response_start)


def aggregate(reports: list[tpb.ResidualReport]) -> tpb.ResidualReport:
    """Counts summed, shares and means averaged, maxima maxed, flags or-ed (lossless and-ed)."""
    out = tpb.ResidualReport(lossless=all(r.lossless for r in reports))
    if not reports:
        return out
    for f in tpb.ResidualReport.DESCRIPTOR.fields:
        values = [getattr(r, f.name) for r in reports]
        if f.name == "lossless":
            continue
        if f.type == f.TYPE_BOOL:
            setattr(out, f.name, any(values))
        elif f.name.startswith("max_"):
            setattr(out, f.name, max(values))
        elif f.type == f.TYPE_DOUBLE:
            setattr(out, f.name, sum(values) / len(values))
        else:
            setattr(out, f.name, sum(values))
    return out


class AlignServicer:
    def __init__(self, aligner: Aligner, auth: Authenticator, limiter: RateLimiter):
        self.aligner, self.auth, self.limiter = aligner, auth, limiter

    async def _principal(self, context, cost: float = 1.0):
        return await grpc_principal(self.auth, self.limiter, context, cost)

    async def Align(self, request, context):
        await self._principal(context)
        return await asyncio.to_thread(self.aligner.align, request)

    async def AlignBatch(self, request, context):
        await self._principal(context, cost=min(max(1, len(request.requests)), self.aligner.settings.max_batch))
        return await asyncio.to_thread(self.aligner.align_batch, request)

    async def RegisterTokenizer(self, request, context):
        (await self._principal(context)).require_admin()
        return await asyncio.to_thread(self.aligner.register, request)

    async def ListTokenizers(self, request, context):
        await self._principal(context)
        return self.aligner.list()

    async def WhoAmI(self, request, context):
        return who_am_i(await self._principal(context), self.auth, request, "mrl.v1.TokenizerAlign")


def _check_reductions(doc: dict) -> None:
    """ParseDict wraps an out-of-range enum number (2**32 + 2 becomes ALL): refuse it instead."""
    requests = doc.get("requests", [doc])
    for r in requests if isinstance(requests, list) else ():
        traces = r.get("traces") if isinstance(r, dict) else None
        for t in traces if isinstance(traces, list) else ():
            reduction = t.get("reduction") if isinstance(t, dict) else None
            if isinstance(reduction, (int, float)) and not isinstance(reduction, bool) and reduction not in range(5):
                raise InvalidArgument(f"trace reduction {reduction} is not a TraceReduction (0-4 or its name)")


def _parse(request_cls, raw: bytes):
    """JSON body -> request message (off the event loop)."""
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError):
        raise InvalidArgument("the body is not JSON (or nests too deeply)") from None
    if not isinstance(doc, dict):
        raise InvalidArgument("the body must be a JSON object")
    _check_reductions(doc)
    try:
        message = json_format.ParseDict(doc, request_cls())
    except (json_format.ParseError, RecursionError) as exc:
        raise InvalidArgument(f"malformed {request_cls.DESCRIPTOR.name}: {exc}") from None
    return message


def _answer(work, message) -> dict:
    """work(message) -> JSON-ready dict (off the event loop)."""
    return json_format.MessageToDict(work(message), preserving_proto_field_name=True)


def create_rest_app(aligner: Aligner, auth: Authenticator, limiter: RateLimiter) -> FastAPI:
    """The REST twin: the same messages in their protobuf JSON form."""
    async def ready():
        return None if aligner.registry.all() else "no tokenizer is registered"

    app, principal, admin = rest_app("mrl tokenizer_align", "Tokenizer Heterogeneity Layer (THL): align responses "
                                     "and token-level traces across tokenizers.", auth, limiter,
                                     aligner.metrics.registry, ready)

    limit = aligner.settings.max_message_bytes

    async def call(request: Request, work, request_cls, charge=None) -> dict:
        """Read and parse the body, `await charge(message)` when given, answer work(message)."""
        declared = int(request.headers.get("content-length") or 0)
        if declared > limit:
            raise InvalidArgument(f"the body is {declared} bytes; at most {limit} (MRL_MAX_MESSAGE_BYTES)")
        raw = bytearray()
        async for chunk in request.stream():
            raw += chunk
            if len(raw) > limit:
                raise InvalidArgument(f"the body exceeds {limit} bytes (MRL_MAX_MESSAGE_BYTES)")
        message = await asyncio.to_thread(_parse, request_cls, bytes(raw))
        if charge is not None:
            await charge(message)
        return await asyncio.to_thread(_answer, work, message)

    @app.post("/v1/align", dependencies=[Depends(principal)], **proto_json(tpb.AlignRequest, tpb.AlignResponse))
    async def align_one(request: Request):
        return await call(request, aligner.align, tpb.AlignRequest)

    @app.post("/v1/align/batch", **proto_json(tpb.AlignBatchRequest, tpb.AlignBatchResponse))
    async def align_many(request: Request, who=Depends(principal)):
        async def charge(batch: tpb.AlignBatchRequest) -> None:
            # charged per alignment, as over gRPC (the dependency took one already)
            await limiter.take(who.name, min(max(0, len(batch.requests) - 1), aligner.settings.max_batch))
        return await call(request, aligner.align_batch, tpb.AlignBatchRequest, charge)

    @app.get("/v1/tokenizers", dependencies=[Depends(principal)], **proto_json(response_cls=tpb.ListTokenizersResponse))
    async def tokenizers():
        return json_format.MessageToDict(aligner.list(), preserving_proto_field_name=True)

    @app.post("/v1/tokenizers", dependencies=[Depends(admin)],
              **proto_json(tpb.RegisterTokenizerRequest, tpb.RegisterTokenizerResponse))
    async def register(request: Request):
        return await call(request, aligner.register, tpb.RegisterTokenizerRequest)

    return app
