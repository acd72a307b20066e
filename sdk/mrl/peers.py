"""Peer experience for one policy: a background subscription to the exchange, and THL retokenization.

    inbox = PeerInbox(exchange, run_id, policy, kinds, peers, max_staleness)
    arrived = inbox.collect(step, prompt_ids, timeout_s)     # waits at most timeout_s, never longer
    own_ids, chunks, stats = Retokenizer(tokenizer_id, align_client)([(peer_tokenizer_id, peer_ids), ...])

Any trainer that joins a run uses these (the mrl trainer, mrl_trainer.peers; the TRL integration,
mrl.integrations.trl).

Coordination by global prompt id: every policy sees the same prompt ids at step t, so policy k's
step t needs its peers' experience of those ids. A (prompt, producer) pair is *complete* when
its group_stats has arrived and, for the kinds subscribed, all of its rollouts (one per reward)
and successes (one per reward ≥ 1). `collect` returns when every expected producer (the
configured peers; with none configured, at least one producer) is complete for every prompt, or
when the timeout passes, whichever is first: a slow or dead peer never blocks a policy.

Staleness: an experience whose policy version is below (own step − max_staleness) is dropped on
arrival and pruned while waiting. Deliveries are acked when `collect` takes them for a step, or
when dropped; a delivery left unacked past the exchange's visibility timeout (e.g. a fast peer's
next step while this trainer updates) comes again and is recognised by its experience id. A
trainer resumed from an earlier checkpoint replays its steps without the peers' experience it
had already taken (each such step waits its peer wait, then goes on).

A subscription that ends, or a peer tokenizer with no THL client, raises FailedPrecondition.
"""
import collections
import logging
import threading
import time
from dataclasses import dataclass, field

from mrl.errors import FailedPrecondition, MrlError
from mrl.experience import kind_of

__all__ = ["PeerInbox", "PeerIndex", "Arrived", "Retokenizer"]

log = logging.getLogger("mrl.peers")


@dataclass
class _Entry:
    """One producer's experience of one prompt."""
    version: int
    group_rewards: list[float] | None = None
    rollouts: list = field(default_factory=list)      # pb.Rollout
    successes: list = field(default_factory=list)     # pb.VerifiedSuccess
    deliveries: list[str] = field(default_factory=list)
    seen: set[str] = field(default_factory=set)       # experience ids: a redelivery is not stored twice


@dataclass
class Arrived:
    """What `collect` returns: per prompt id, per producer, the entry; the peers' capabilities; wait stats."""
    entries: dict[str, dict[str, _Entry]]
    capability: dict[str, float]
    waited_s: float
    complete: float          # share of (prompt, expected producer) pairs complete at return


class PeerIndex:
    """The peers' experience by prompt id and producer, and their latest capabilities: what the inbox keeps
    between steps (PeerInbox holds its lock around every call; the bandit testbed uses it directly).

    Experience below `floor` (step − max_staleness) is not kept; a redelivered experience (same id) is
    stored once; policy_stats only update the producer's capability P̂."""

    def __init__(self):
        self.floor = 0
        self.entries: dict[str, dict[str, _Entry]] = collections.defaultdict(dict)
        self._capability: dict[str, tuple[int, float]] = {}

    def add(self, e, delivery_id: str | None = None) -> bool:
        """Index one experience (and the delivery that brought it); False when nothing waits for a step
        (stale, or policy_stats): its delivery can be acked at once."""
        kind = kind_of(e)
        if e.policy_version < self.floor:
            return False
        if kind == "policy_stats":
            if e.policy_version >= self._capability.get(e.producer, (-1, 0.0))[0]:
                self._capability[e.producer] = (e.policy_version, e.policy_stats.capability)
            return False
        payload = getattr(e, kind)
        entry = self.entries[payload.prompt_id].setdefault(e.producer, _Entry(e.policy_version))
        if delivery_id is not None:
            entry.deliveries.append(delivery_id)
        if e.experience_id not in entry.seen:
            entry.seen.add(e.experience_id)
            if kind == "group_stats":
                entry.group_rewards = list(payload.rewards)
            else:
                (entry.rollouts if kind == "rollout" else entry.successes).append(payload)
        return True

    def take(self, prompt_ids: list[str]) -> dict[str, dict[str, _Entry]]:
        """Remove and return the entries of these prompts."""
        return {pid: self.entries.pop(pid) for pid in prompt_ids if pid in self.entries}

    def capability(self) -> dict[str, float]:
        """Each producer's latest published P̂."""
        return {producer: value for producer, (_, value) in self._capability.items()}


class PeerInbox:
    def __init__(self, exchange, run_id: str, policy: str, kinds: tuple[str, ...], peers: list[str],
                 max_staleness: int):
        self.kinds = tuple(sorted({*kinds, "group_stats"}))   # group_stats says how many rollouts to expect
        self.peers, self.max_staleness = list(peers), max_staleness
        self._index = PeerIndex()
        self._cond = threading.Condition()
        self._error: Exception | None = None
        self._closing = False
        self._sub = exchange.subscribe(run_id, policy, kinds=self.kinds, producers=self.peers, start="earliest",
                                       max_in_flight=1024)
        self._thread = threading.Thread(target=self._pump, name=f"peers-{policy}", daemon=True)
        self._thread.start()

    def _pump(self) -> None:
        error: Exception = FailedPrecondition("the exchange ended the subscription to the peers' experience")
        try:
            for delivery in self._sub:
                self._ack(self._add(delivery))
        except Exception as exc:     # noqa: BLE001 - any end of the pump is reported by the next collect()
            error = exc
        finally:
            with self._cond:
                if not self._closing:
                    self._error = error
                self._cond.notify_all()

    def _add(self, delivery) -> list[str]:
        """Store one delivery; returns the delivery ids to ack now (stale, or policy_stats)."""
        with self._cond:
            if not self._index.add(delivery.experience, delivery.delivery_id):
                return [delivery.delivery_id]
            self._cond.notify_all()
            return []

    def _ack(self, delivery_ids: list[str]) -> None:
        if delivery_ids:
            try:
                self._sub.ack(delivery_ids)
            except MrlError as exc:   # not fatal: unacked entries are delivered again, and dropped again
                log.warning("could not ack %d peer deliveries: %s", len(delivery_ids), exc)

    def _complete(self, entry: _Entry) -> bool:
        if entry.group_rewards is None:
            return False
        if "rollout" in self.kinds and len(entry.rollouts) < len(entry.group_rewards):
            return False
        return "success" not in self.kinds or len(entry.successes) >= sum(r >= 1.0 for r in entry.group_rewards)

    def _progress(self, prompt_ids: list[str]) -> tuple[int, int]:
        """(complete pairs, expected pairs) over the prompts and the expected producers."""
        done = 0
        for pid in prompt_ids:
            by_producer = self._index.entries.get(pid, {})
            if self.peers:
                done += sum(p in by_producer and self._complete(by_producer[p]) for p in self.peers)
            else:
                done += any(self._complete(x) for x in by_producer.values())
        return done, len(prompt_ids) * max(len(self.peers), 1)

    def _prune(self) -> list[str]:
        """Drop entries below the staleness floor; returns their delivery ids (to ack outside the lock)."""
        stale = []
        entries = self._index.entries
        for pid, by_producer in list(entries.items()):
            for producer, entry in list(by_producer.items()):
                if entry.version < self._index.floor:
                    stale += entry.deliveries
                    del by_producer[producer]
            if not by_producer:
                del entries[pid]
        return stale

    def collect(self, step: int, prompt_ids: list[str], timeout_s: float, stop=lambda: False) -> Arrived:
        """The peers' experience of these prompts: waits until complete, `timeout_s` or stop(), then takes
        what arrived."""
        start = time.monotonic()
        with self._cond:
            self._index.floor = step - self.max_staleness
            stale = self._prune()
            while True:
                if self._error is not None:
                    raise FailedPrecondition(f"the subscription to the peers' experience failed: {self._error}")
                done, expected = self._progress(prompt_ids)
                left = timeout_s - (time.monotonic() - start)
                if done == expected or left <= 0 or stop():
                    break
                self._cond.wait(min(left, 0.5))
            taken = self._index.take(prompt_ids)
            capability = self._index.capability()
        waited = time.monotonic() - start
        self._ack(stale + [d for by_producer in taken.values() for entry in by_producer.values()
                           for d in entry.deliveries])          # an ack is an RPC: never under the lock
        return Arrived(taken, capability, waited, done / expected)

    def close(self) -> None:
        with self._cond:
            self._closing = True
        self._sub.close()
        self._thread.join(timeout=5)


class Retokenizer:
    """Peers' token ids → this policy's, through THL (`mrl.align_client.AlignClient`); identity for the same tokenizer.

    `missing_thl` ends the error raised when a peer uses another tokenizer and no THL client was given: how to
    give one in the caller's terms (the mrl trainer: its `sharing.align.target`)."""

    def __init__(self, tokenizer_id: str, align_client=None,
                 missing_thl: str = "pass an mrl.AlignClient of a THL service (mrl align serve) to retokenize them"):
        self.tokenizer_id, self.client, self.missing_thl = tokenizer_id, align_client, missing_thl

    def __call__(self, items: list[tuple[str, list[int]]]) -> tuple[list[list[int]], list[int], dict[str, float]]:
        """[(source tokenizer id, ids)] → ([own ids], [chunks C(y)], THL residual stats over the ones that needed
        THL). C(y) is THL's count of aligned chunks; with the same tokenizer each token is its own chunk."""
        out: list[list[int] | None] = [list(ids) if tid == self.tokenizer_id else None for tid, ids in items]
        chunks = [len(ids) if ids is not None else 0 for ids in out]
        todo = [i for i, ids in enumerate(out) if ids is None]
        if not todo:
            return out, chunks, {}
        if self.client is None:
            foreign = sorted({items[i][0] for i in todo})
            raise FailedPrecondition(f"peers use tokenizer(s) {foreign}, this policy uses {self.tokenizer_id!r}: "
                                     f"{self.missing_thl}")
        from mrl.align_client import AlignJob
        try:
            aligned = self.client.align_batch([AlignJob(items[i][0], items[i][1], self.tokenizer_id) for i in todo])
        except MrlError as exc:
            raise type(exc)(f"THL could not retokenize the peers' responses: {exc}") from exc
        for i, a in zip(todo, aligned):
            out[i], chunks[i] = a.target_ids, a.residual.chunks
        n = len(aligned)
        return out, chunks, {"thl_one_to_one": sum(a.residual.one_to_one_share for a in aligned) / n,
                             "thl_lossless": sum(a.lossless for a in aligned) / n,
                             "thl_tokens_per_chunk": sum(a.residual.mean_target_tokens_per_chunk for a in aligned) / n}
