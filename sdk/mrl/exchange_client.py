"""Clients of the Shared Experience Exchange: `ExchangeClient` (blocking) and `AsyncExchangeClient`.

    with ExchangeClient("localhost:50051", token=TOKEN) as see:
        see.publish([new_experience("run-1", "policy-a", step, Rollout(...))])
        for d in see.subscribe("run-1", "policy-a", kinds=["rollout"], max_in_flight=64):
            use(d.experience)
            d.ack()

Both twins share `_Requests`, which opens the channel and builds and checks requests. Publish,
Ack and GetSuccesses are retried with exponential backoff while the exchange is UNAVAILABLE (all
three are idempotent) for the client's retry budget, 30 s unless the caller passes its own
`Backoff` (enough to ride out an exchange restart); a subscription reconnects with backoff, and
whatever it had not acked is delivered again after the visibility timeout. gRPC errors become
`mrl.errors` exceptions.
"""
import asyncio
import time
from collections.abc import Iterable

import grpc

from mrl import errors, experience
from mrl.connection import CHECK_TIMEOUT_S, check_request, checked
from mrl.grpc_client import Backoff, BlockingClient, Connection, call, retry_delay
from mrl.v1 import exchange_pb2 as xpb
from mrl.v1 import exchange_pb2_grpc
from mrl.v1 import experience_pb2 as pb

__all__ = ["ExchangeClient", "AsyncExchangeClient", "Delivery", "Backoff"]

_START = {"latest": xpb.START_POSITION_LATEST, "earliest": xpb.START_POSITION_EARLIEST}
RETRY_BUDGET_S = 30.0  # how long Publish and Ack are retried while the exchange is UNAVAILABLE, by default
SUCCESS_PROMPTS_PER_CALL = 256  # the most prompt ids one GetSuccesses request may carry


class Delivery:
    """One delivered experience; `ack()` it once used (or it is delivered again after the timeout)."""

    __slots__ = ("experience", "delivery_id", "redelivered", "appended_at_ms", "_ack")

    def __init__(self, proto: xpb.Delivery, ack):
        self.experience: pb.Experience = proto.experience
        self.delivery_id = proto.delivery_id
        self.redelivered = proto.redelivered
        self.appended_at_ms = proto.appended_at_ms
        self._ack = ack

    @property
    def kind(self) -> str:
        return experience.kind_of(self.experience)

    def ack(self):
        return self._ack([self.delivery_id])


class _Requests:
    """The channel and token metadata, and request building and checking, shared by both clients."""

    def __init__(self, target: str, token: str | None, tls_root_cert: bytes | None, max_message_bytes: int,
                 aio: bool = False, token_source: str | None = None, target_source: str | None = None):
        self.connection = Connection("exchange", target, token, tls_root_cert, max_message_bytes, aio, token_source,
                                     target_source)
        self.max_message_bytes = max_message_bytes

    @property
    def max_response_bytes(self) -> int:
        """The channel's receive limit, as a request's max_response_bytes (so no response is refused)."""
        return min(max(self.max_message_bytes, 0), 2**32 - 1)  # < 0: unlimited → 0: the server's default

    @staticmethod
    def publish(experiences: Iterable[pb.Experience]) -> xpb.PublishRequest:
        batch = list(experiences)
        for e in batch:
            experience.validate(e)
        return xpb.PublishRequest(experiences=batch)

    def subscribe(self, run_id, subscriber, kinds, producers, include_own, start, max_in_flight,
                  min_policy_version, max_version_lag, visibility_timeout_s,
                  lag_exempt_kinds=()) -> xpb.SubscribeRequest:
        """The request, stating the channel's receive limit as max_response_bytes."""
        if start not in _START:
            raise errors.InvalidArgument(f"start {start!r} must be one of {', '.join(_START)}")
        req = xpb.SubscribeRequest(
            run_id=run_id, subscriber=subscriber, kinds=[experience.kind_enum(k) for k in kinds],
            producers=list(producers), include_own=include_own, start=_START[start], max_in_flight=max_in_flight,
            min_policy_version=min_policy_version, visibility_timeout_ms=int(visibility_timeout_s * 1000),
            max_response_bytes=self.max_response_bytes)
        if max_version_lag is not None:
            req.max_version_lag = max_version_lag
        req.lag_exempt_kinds.extend(experience.kind_enum(k) for k in lag_exempt_kinds)
        return req

    def get_successes(self, run_id, subscriber, prompt_ids, producers, max_per_prompt) -> xpb.GetSuccessesRequest:
        return xpb.GetSuccessesRequest(run_id=run_id, subscriber=subscriber,
                                       prompt_ids=prompt_ids[:SUCCESS_PROMPTS_PER_CALL],
                                       producers=list(producers), max_per_prompt=max_per_prompt,
                                       max_response_bytes=self.max_response_bytes)

    @staticmethod
    def unanswered(prompts: list[str], reply: xpb.GetSuccessesResponse) -> list[str]:
        """The prompts a GetSuccesses reply had no room for; an exchange that answers none cannot make progress."""
        if reply.prompts_answered == 0 and prompts:
            raise errors.FailedPrecondition(f"the exchange answered none of {len(prompts)} prompt(s) in GetSuccesses")
        return prompts[reply.prompts_answered:]


class ExchangeClient(BlockingClient):
    def __init__(self, target: str, token: str | None = None, *, tls_root_cert: bytes | None = None,
                 max_message_bytes: int = 16 << 20, backoff: Backoff | None = None, token_source: str | None = None,
                 target_source: str | None = None):
        """`token`: the bearer token, or None for the environment's MRL_TOKEN; `token_source` and `target_source`
        name where the caller took the token and the target from, for the errors (mrl.grpc_client.Connection)."""
        self._req = _Requests(target, token, tls_root_cert, max_message_bytes, token_source=token_source,
                              target_source=target_source)
        self._connection = self._req.connection
        self._stub = exchange_pb2_grpc.ExperienceExchangeStub(self._connection.channel)
        self.backoff = backoff or Backoff(attempts=None, budget_s=RETRY_BUDGET_S)

    def _call(self, method, request, retry: bool = False):
        return call(method, request, self._connection, self.backoff, retry)

    def publish(self, experiences: Iterable[pb.Experience]) -> xpb.PublishResponse:
        """Publish a batch (one run); retried while UNAVAILABLE, since publish is idempotent."""
        return self._call(self._stub.Publish, self._req.publish(experiences), retry=True)

    def ack(self, run_id: str, subscriber: str, delivery_ids: list[str], subscription_id: str = "") -> int:
        req = xpb.AckRequest(run_id=run_id, subscriber=subscriber, delivery_ids=delivery_ids,
                             subscription_id=subscription_id)
        return self._call(self._stub.Ack, req, retry=True).acked

    def get_successes(self, run_id: str, subscriber: str, prompt_ids: Iterable[str], producers: Iterable[str] = (),
                      max_per_prompt: int = 0) -> list[pb.Experience]:
        """The newest verified successes of each prompt from `producers` (default: every producer but
        `subscriber`), each prompt's newest first, however long ago they were published; asks in requests of at
        most SUCCESS_PROMPTS_PER_CALL prompts, and again for the prompts a response had no room for. Retried
        while UNAVAILABLE (a read)."""
        prompts, successes = list(prompt_ids), []
        while True:
            req = self._req.get_successes(run_id, subscriber, prompts, producers, max_per_prompt)
            reply = self._call(self._stub.GetSuccesses, req, retry=True)
            successes += reply.successes
            prompts = self._req.unanswered(prompts, reply)
            if not prompts:
                return successes

    def list_topics(self, run_id: str) -> list[xpb.Topic]:
        return list(self._call(self._stub.ListTopics, xpb.ListTopicsRequest(run_id=run_id)).topics)

    def topic_stats(self, run_id: str, kind: str = "", producer: str = "") -> list[xpb.TopicStats]:
        req = xpb.GetTopicStatsRequest(run_id=run_id, kind=experience.kind_enum(kind) if kind else 0,
                                       producer=producer)
        return list(self._call(self._stub.GetTopicStats, req).topics)

    def subscribe(self, run_id: str, subscriber: str, kinds: Iterable[str] = (), producers: Iterable[str] = (),
                  *, include_own: bool = False, start: str = "latest", max_in_flight: int = 64,
                  min_policy_version: int = 0, max_version_lag: int | None = None,
                  visibility_timeout_s: float = 0.0, reconnect: Backoff | None = None,
                  lag_exempt_kinds: Iterable[str] = ()):
        """Iterate deliveries forever (reconnecting with backoff); break out, or call `.close()`. The exchange drops
        what is older than min_policy_version, or max_version_lag behind its producer's latest version (but for
        lag_exempt_kinds)."""
        req = self._req.subscribe(run_id, subscriber, kinds, producers, include_own, start, max_in_flight,
                                  min_policy_version, max_version_lag, visibility_timeout_s, lag_exempt_kinds)
        return Subscription(self, req, reconnect or Backoff(attempts=None))


class Subscription:
    """A blocking iterator of `Delivery`; reconnects after UNAVAILABLE."""

    def __init__(self, client: ExchangeClient, request: xpb.SubscribeRequest, reconnect: Backoff):
        self._client, self._request, self._reconnect = client, request, reconnect
        self._call = None
        self.subscription_id = ""
        self._closed = False

    def ack(self, deliveries: Iterable["Delivery | str"]) -> int:
        ids = [d if isinstance(d, str) else d.delivery_id for d in deliveries]
        return self._client.ack(self._request.run_id, self._request.subscriber, ids, self.subscription_id)

    def close(self) -> None:
        self._closed = True
        if self._call is not None:
            self._call.cancel()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __iter__(self):
        for batch in self.batches():
            yield from batch

    def batches(self):
        """Like iterating, but one list of `Delivery` per message the exchange sends (to ack them in one call)."""
        delays = None
        while not self._closed:
            self._call = self._client._stub.Subscribe(self._request, metadata=self._client._connection.metadata)
            if self._closed:  # closed from another thread while the call was being made
                self._call.cancel()
                return
            try:
                for response in self._call:
                    self.subscription_id = response.subscription_id
                    if response.deliveries:
                        delays = None  # delivering: the backoff starts afresh after the next failure
                    if response.deliveries:
                        yield [Delivery(d, self.ack) for d in response.deliveries]
                return
            except grpc.RpcError as exc:
                if self._closed:
                    return
                delays = delays or self._reconnect.delays()
                time.sleep(retry_delay(exc, delays, self._client._connection))


class AsyncExchangeClient:
    """The asyncio twin of ExchangeClient."""

    def __init__(self, target: str, token: str | None = None, *, tls_root_cert: bytes | None = None,
                 max_message_bytes: int = 16 << 20, backoff: Backoff | None = None, token_source: str | None = None,
                 target_source: str | None = None):
        self._req = _Requests(target, token, tls_root_cert, max_message_bytes, aio=True, token_source=token_source,
                              target_source=target_source)
        self._connection = self._req.connection
        self._stub = exchange_pb2_grpc.ExperienceExchangeStub(self._connection.channel)
        self.backoff = backoff or Backoff(attempts=None, budget_s=RETRY_BUDGET_S)

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.close()

    async def close(self) -> None:
        await self._connection.channel.close()

    async def check(self, run_id: str = "", policy: str = ""):
        """The connection check (mrl.connection), as ExchangeClient.check."""
        try:
            return await self._stub.WhoAmI(check_request(run_id, policy), metadata=self._connection.metadata,
                                           timeout=CHECK_TIMEOUT_S)
        except grpc.RpcError as exc:
            return checked(self._connection, exc)

    async def _call(self, method, request, retry: bool = False):
        delays = self.backoff.delays() if retry else iter(())
        while True:
            try:
                return await method(request, metadata=self._connection.metadata)
            except grpc.RpcError as exc:
                await asyncio.sleep(retry_delay(exc, delays, self._connection))

    async def publish(self, experiences: Iterable[pb.Experience]) -> xpb.PublishResponse:
        return await self._call(self._stub.Publish, self._req.publish(experiences), retry=True)

    async def ack(self, run_id: str, subscriber: str, delivery_ids: list[str], subscription_id: str = "") -> int:
        req = xpb.AckRequest(run_id=run_id, subscriber=subscriber, delivery_ids=delivery_ids,
                             subscription_id=subscription_id)
        return (await self._call(self._stub.Ack, req, retry=True)).acked

    async def get_successes(self, run_id: str, subscriber: str, prompt_ids: Iterable[str],
                            producers: Iterable[str] = (), max_per_prompt: int = 0) -> list[pb.Experience]:
        """See ExchangeClient.get_successes."""
        prompts, successes = list(prompt_ids), []
        while True:
            req = self._req.get_successes(run_id, subscriber, prompts, producers, max_per_prompt)
            reply = await self._call(self._stub.GetSuccesses, req, retry=True)
            successes += reply.successes
            prompts = self._req.unanswered(prompts, reply)
            if not prompts:
                return successes

    async def subscribe(self, run_id: str, subscriber: str, kinds: Iterable[str] = (),
                        producers: Iterable[str] = (), *, include_own: bool = False, start: str = "latest",
                        max_in_flight: int = 64, min_policy_version: int = 0, max_version_lag: int | None = None,
                        visibility_timeout_s: float = 0.0, reconnect: Backoff | None = None,
                        lag_exempt_kinds: Iterable[str] = ()):
        """Async-iterate deliveries forever, reconnecting with backoff; each has `await d.ack()`."""
        req = self._req.subscribe(run_id, subscriber, kinds, producers, include_own, start, max_in_flight,
                                  min_policy_version, max_version_lag, visibility_timeout_s, lag_exempt_kinds)
        delays = None
        subscription_id = ""

        async def ack(ids):
            return await self.ack(run_id, subscriber, ids, subscription_id)

        while True:
            call = self._stub.Subscribe(req, metadata=self._connection.metadata)
            try:
                async for response in call:
                    subscription_id = response.subscription_id
                    if response.deliveries:
                        delays = None
                    for d in response.deliveries:
                        yield Delivery(d, ack)
                return
            except grpc.RpcError as exc:
                delays = delays or (reconnect or Backoff(attempts=None)).delays()
                await asyncio.sleep(retry_delay(exc, delays, self._connection))
            finally:
                call.cancel()
