"""The success library: each producer's newest verified successes per prompt, kept beyond the streams' retention,
for GetSuccesses (a receiver meeting a prompt again, a policy that joins late or resumes from a checkpoint).

Key (the run in braces is the run's Redis Cluster hash tag, as for every key of a run):

    mrl:{run}:library:{producer}:{prompt digest}   list of b"<order> <Experience bytes>", newest first
    mrl:{run}:library-order                        the run's count of library writes: the next <order>

The prompt digest is the first 32 hex digits of the SHA-256 of the prompt id (core.library_key). Publish writes a
new success there in the same atomic script that appends it to its stream (core.py), trims the list to
MRL_SUCCESS_LIBRARY_PER_PROMPT entries and sets it to expire MRL_SUCCESS_LIBRARY_TTL_S after this last write.
A duplicate (an experience id seen within MRL_DEDUPE_TTL_S) is neither appended nor kept.

Keyed per (prompt, producer), not per prompt: a prolific producer — or the asking policy itself, whose successes
a query leaves out by default — cannot evict a peer's successes for the prompt, so whichever producers a query
names, what is stored for it is its own newest. A query merges the named producers' lists by <order>, the order in
which the exchange took them across producers (entries written before the counter existed, b"<ms>-<seq> <payload>"
with their stream entry id, count as older than every counted one), and answers the newest `max_per_prompt` of
them all, so in a response a prolific producer can outnumber the others (name producers to choose). The producers
with successes are the run's topics ("success:<producer>"), which outlive stream trimming.

Retention: the library outlives the streams (that is its point) and is bounded by prompts × producers × the cap ×
MRL_MAX_EXPERIENCE_BYTES, and by the TTL: a prompt no producer has solved again for that long is forgotten.
Deleting the run (admin) removes it with the run's other keys.

A response answers whole prompts, in the request's order, within the caller's max_response_bytes; the prompts
left out are for the caller to ask again (`prompts_answered`, `truncated`). Only a first prompt whose successes
alone exceed it is answered in part: with its newest that fit.
"""
import heapq
import itertools

from mrl import experience
from mrl.errors import FailedPrecondition, InvalidArgument
from mrl.exchange_client import SUCCESS_PROMPTS_PER_CALL
from mrl.v1 import exchange_pb2 as xpb
from mrl_exchange.core import Exchange, library_key, redis_call, response_limit, topics_key

__all__ = ["get_successes", "MAX_PROMPTS", "MAX_PRODUCERS", "MAX_PER_PROMPT"]

MAX_PROMPTS = SUCCESS_PROMPTS_PER_CALL   # prompt ids in one GetSuccesses (the SDK sends at most this many)
MAX_PRODUCERS = 256    # producers named in one GetSuccesses
MAX_PER_PROMPT = 64    # successes per prompt in one GetSuccesses
_RESPONSE_HEADROOM = 16  # bytes of a GetSuccessesResponse beside its successes: truncated, prompts_answered
_SUCCESS_OVERHEAD = 6    # bytes of one success beside its own: the field tag and the length (< 2^35)


async def get_successes(exchange: Exchange, request: xpb.GetSuccessesRequest) -> xpb.GetSuccessesResponse:
    """The newest successes of each asked prompt from the asked producers (see the module's docstring).
    InvalidArgument for a malformed request, FailedPrecondition when the library is off or a success cannot fit
    in a response alone. The caller is authorized as `request.subscriber` already (as for Subscribe)."""
    s = exchange.settings
    run_id = experience.validate_name("run_id", request.run_id)
    subscriber = experience.validate_name("subscriber", request.subscriber)
    prompt_ids = _prompt_ids(request.prompt_ids)
    if len(request.producers) > MAX_PRODUCERS:
        raise InvalidArgument(f"{len(request.producers)} producers named; at most {MAX_PRODUCERS} "
                              f"(or none: every producer but the subscriber)")
    producers = [experience.validate_name("producer", p) for p in request.producers]
    if len(set(producers)) < len(producers):
        raise InvalidArgument("producers names a policy more than once; name each once")
    if request.max_per_prompt > MAX_PER_PROMPT:
        raise InvalidArgument(f"max_per_prompt {request.max_per_prompt} exceeds {MAX_PER_PROMPT} "
                              f"(0: the exchange's default)")
    budget = response_limit(request.max_response_bytes, s.max_message_bytes) - _RESPONSE_HEADROOM
    if not s.success_library_per_prompt:
        raise FailedPrecondition("this exchange keeps no success library (MRL_SUCCESS_LIBRARY_PER_PROMPT is 0): "
                                 "subscribe with start=EARLIEST to read the successes its streams retain")
    per_prompt = request.max_per_prompt or min(s.success_library_per_prompt, MAX_PER_PROMPT)
    producers = producers or await _producers_with_successes(exchange, run_id, subscriber)
    response = xpb.GetSuccessesResponse()
    for prompt_id in prompt_ids:
        found = await _newest(exchange, run_id, producers, prompt_id, per_prompt)
        sizes = list(itertools.accumulate(len(payload) + _SUCCESS_OVERHEAD for payload in found))
        fits = sum(size <= budget for size in sizes)  # sizes grow: the newest `fits` fit
        if fits < len(found):
            response.truncated = True
            if response.prompts_answered:
                break  # whole prompts only, but for the first
            if not fits:
                raise _too_large(exchange, prompt_id, sizes[0] - _SUCCESS_OVERHEAD, budget + _RESPONSE_HEADROOM)
        for payload in found[:fits]:
            response.successes.add().ParseFromString(payload)
        response.prompts_answered += 1
        if response.truncated:
            break
        budget -= sizes[-1] if sizes else 0
    exchange.metrics.successes_served.inc(len(response.successes))
    return response


def _prompt_ids(prompt_ids) -> list[str]:
    if not 1 <= len(prompt_ids) <= MAX_PROMPTS:
        raise InvalidArgument(f"{len(prompt_ids)} prompt ids; ask for 1 to {MAX_PROMPTS} per GetSuccesses")
    seen = set()
    for i, prompt_id in enumerate(prompt_ids):
        experience.check_text_id(f"prompt_ids[{i}]", prompt_id)
        if prompt_id in seen:
            raise InvalidArgument(f"prompt_ids[{i}] {prompt_id!r} is named before; name each prompt once")
        seen.add(prompt_id)
    return list(prompt_ids)


async def _producers_with_successes(exchange: Exchange, run_id: str, subscriber: str) -> list[str]:
    """Every producer that has published a success in the run, but the subscriber."""
    topics = await redis_call(exchange.redis.smembers(topics_key(run_id)))
    producers = (t.decode().split(":", 1) for t in topics)
    return sorted(p for kind, p in producers if kind == "success" and p != subscriber)


async def _newest(exchange: Exchange, run_id: str, producers: list[str], prompt_id: str, n: int) -> list[bytes]:
    """The serialized `n` newest successes of the prompt from these producers, newest first."""
    if not producers:
        return []
    async with exchange.redis.pipeline(transaction=False) as pipe:
        for producer in producers:
            pipe.lrange(library_key(run_id, producer, prompt_id), 0, n - 1)
        lists = await redis_call(pipe.execute())
    entries = heapq.merge(*([_parse_entry(e) for e in entries] for entries in lists), reverse=True)
    return [payload for _, payload in itertools.islice(entries, n)]


def _parse_entry(entry: bytes) -> tuple[tuple[int, int, int], bytes]:
    """b"<order> <payload>" -> ((1, order, 0), payload); an older entry b"<ms>-<seq> <payload>" -> ((0, ms, seq),
    payload), before every ordered one."""
    stamp, _, payload = entry.partition(b" ")
    ms, dash, seq = stamp.partition(b"-")
    return ((0, int(ms), int(seq)) if dash else (1, int(stamp), 0)), payload


def _too_large(exchange: Exchange, prompt_id: str, size: int, limit: int) -> FailedPrecondition:
    return FailedPrecondition(
        f"the newest success for prompt {prompt_id!r} holds {size} bytes, more than a response of max_response_bytes "
        f"({limit}) can carry; ask with a larger max_response_bytes (and a receive limit to match; at most the "
        f"exchange's MRL_MAX_MESSAGE_BYTES, {exchange.settings.max_message_bytes})")
