"""The gRPC ExperienceExchange servicer: authenticate, authorize, rate-limit, call the core."""
import grpc

from mrl import experience
from mrl.auth import Authenticator, Principal
from mrl_serving.ratelimit import RateLimiter
from mrl_serving.server import grpc_principal, who_am_i
from mrl.v1 import exchange_pb2 as xpb
from mrl.v1 import identity_pb2 as ipb
from mrl_exchange.core import Exchange
from mrl_exchange.subscription import Subscription
from mrl_exchange.successes import get_successes

__all__ = ["ExchangeServicer"]


class ExchangeServicer:
    def __init__(self, exchange: Exchange, auth: Authenticator, limiter: RateLimiter):
        self.exchange, self.auth, self.limiter = exchange, auth, limiter

    async def _principal(self, context: grpc.aio.ServicerContext, cost: float = 1.0) -> Principal:
        return await grpc_principal(self.auth, self.limiter, context, cost)

    async def Publish(self, request: xpb.PublishRequest, context) -> xpb.PublishResponse:
        # An oversize batch is refused by validation (INVALID_ARGUMENT), not by the rate limit.
        cost = min(max(1, len(request.experiences)), self.exchange.settings.max_batch)
        principal = await self._principal(context, cost)
        for exp in request.experiences:
            principal.require_policy(exp.producer, exp.run_id, "publish")
        return await self.exchange.publish(list(request.experiences))

    async def Subscribe(self, request: xpb.SubscribeRequest, context):
        principal = await self._principal(context)
        principal.require_policy(request.subscriber, request.run_id, "subscribe")
        subscription = Subscription(self.exchange, request, owner=principal.name)
        await subscription.pin_start()           # before the first message: see Subscription.pin_start
        yield xpb.SubscribeResponse(subscription_id=subscription.id)
        async for response in subscription.deliveries():
            yield response  # a RawSubscribeResponse: encodes to a SubscribeResponse

    async def Ack(self, request: xpb.AckRequest, context) -> xpb.AckResponse:
        cost = min(max(1, len(request.delivery_ids)), self.exchange.settings.max_in_flight_limit)
        principal = await self._principal(context, cost)
        principal.require_policy(request.subscriber, request.run_id, "ack")
        acked = await self.exchange.ack(request.run_id, request.subscriber, request.delivery_ids,
                                        request.subscription_id)
        return xpb.AckResponse(acked=acked)

    async def GetSuccesses(self, request: xpb.GetSuccessesRequest, context) -> xpb.GetSuccessesResponse:
        # a read per (prompt, named producer): the cost is the prompts, times the producers when named
        cost = max(1, len(request.prompt_ids)) * max(1, len(request.producers))
        principal = await self._principal(context, min(cost, self.exchange.settings.rate_limit_burst))
        principal.require_policy(request.subscriber, request.run_id, "read successes")
        return await get_successes(self.exchange, request)

    async def ListTopics(self, request: xpb.ListTopicsRequest, context) -> xpb.ListTopicsResponse:
        (await self._principal(context)).require_run(request.run_id)
        topics = await self.exchange.topics(request.run_id)
        return xpb.ListTopicsResponse(topics=[
            xpb.Topic(run_id=request.run_id, kind=experience.kind_enum(k), producer=p) for k, p in topics])

    async def GetTopicStats(self, request: xpb.GetTopicStatsRequest, context) -> xpb.GetTopicStatsResponse:
        (await self._principal(context)).require_run(request.run_id)
        kind = experience.kind_name(request.kind) if request.kind else ""
        stats = await self.exchange.topic_stats(request.run_id, kind, request.producer)
        return xpb.GetTopicStatsResponse(topics=stats)

    async def WhoAmI(self, request: ipb.WhoAmIRequest, context) -> ipb.WhoAmIResponse:
        return who_am_i(await self._principal(context), self.auth, request, "mrl.v1.ExperienceExchange")
