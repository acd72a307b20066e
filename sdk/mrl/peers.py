"""Peer experience for one policy: a background subscription to the exchange, and THL retokenization.

    inbox = PeerInbox(exchange, run_id, policy, kinds, peers, max_staleness)
    inbox.hold(prompt_ids)                                   # async: when the batch is chosen
    arrived = inbox.collect(step, prompt_ids, timeout_s)     # waits at most timeout_s, never longer
    own_ids, chunks, stats = Retokenizer(tokenizer_id, align_client)([(peer_tokenizer_id, peer_ids), ...])

Any trainer that joins a run uses these (the mrl trainer, mrl_trainer.peers; the TRL integration,
mrl.integrations.trl).

Two couplings, by global prompt id:

  lockstep  every policy sees the same prompt ids at step t, so policy k's step t needs its peers'
            experience of those ids. A (prompt, producer) pair is *complete* when its group_stats has
            arrived and, for the kinds subscribed, all of its rollouts (one per reward) and successes (one
            per reward ≥ 1). `collect` returns when every expected producer (the configured peers; with
            none configured, at least one producer) is complete for every prompt, or when the timeout
            passes, whichever is first: a slow or dead peer never blocks a policy. Staleness: experience
            whose policy version is below (own step − max_staleness) is dropped on arrival and pruned
            while waiting. Deliveries are acked when `collect` takes them for a step, or when dropped; a
            delivery left unacked past the exchange's visibility timeout comes again and is recognised by
            its experience id. A trainer resumed from an earlier checkpoint replays its steps without the
            peers' experience it had already taken (each such step waits its peer wait, then goes on).
  async     no policy waits for another (`collect` with timeout 0): a policy takes whatever its peers
            have published for the prompts of its batch, kept across steps. Staleness is a peer's own
            lag: a group (its rollouts and group_stats) of version v from producer p is dropped once
            v < (p's latest version seen − max_staleness), or once it is older than max_age_s (the
            producer's created_at); a newer group of the same (prompt, producer) replaces an older one.
            Staleness is judged when the policy chooses its batch (`hold`), not when it takes the batch's
            experience after its rollout: a slow policy's long rollout does not let a fast peer's versions
            run past the groups it chose its prompts for.
            Verified successes are kept however old (the receiver re-verifies them; the newest 8 per
            prompt and producer), and stay when a step takes them, for the next time the policy meets
            the prompt. At most max_prompts
            prompts are kept (the least recently published go first). Deliveries are acked on arrival,
            one Ack call per message of deliveries the exchange sends: the index, not the exchange,
            holds them while they wait. `offered` lists the prompts with
            peer experience, those with a peer success first, for a peer-guided batch.

The bound is the exchange's first: the inbox subscribes with max_version_lag = max_staleness, so experience more
than max_staleness versions behind its producer's latest (at the exchange) is never delivered (successes under
async excepted: lag_exempt_kinds); what the exchange dropped shows in its mrl_exchange_stale_dropped counter. The
index judges, by the same bound, what it holds as the peers move on, and lockstep's floor (own step −
max_staleness), which the exchange cannot know. Both count what they drop (stale, superseded or evicted
experiences): Arrived.dropped.

A subscription that ends, or a peer tokenizer with no THL client, raises FailedPrecondition.
"""
import collections
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Literal

from mrl.errors import FailedPrecondition, MrlError
from mrl.experience import kind_of

__all__ = ["PeerInbox", "PeerIndex", "Arrived", "Retokenizer", "COUPLINGS", "guided_batch"]

log = logging.getLogger("mrl.peers")

Coupling = Literal["lockstep", "async"]
COUPLINGS: tuple[str, ...] = ("lockstep", "async")


@dataclass
class _Entry:
    """One producer's experience of one prompt: its latest group (rollouts, group_stats) and its successes."""
    version: int                                      # of the group
    created_s: float = 0.0                            # the group's newest created_at (producer's clock, s)
    group_rewards: list[float] | None = None
    rollouts: list = field(default_factory=list)      # pb.Rollout
    successes: list = field(default_factory=list)     # pb.VerifiedSuccess, oldest first
    deliveries: list[str] = field(default_factory=list)
    group_ids: set[str] = field(default_factory=set)   # experience ids of the group of `version` (held or used)
    success_ids: list[str] = field(default_factory=list)   # of `successes`: a redelivery is not stored twice

    def drop_group(self) -> int:
        """Forget the group (not the successes); returns how many experiences that was."""
        n = len(self.rollouts) + (self.group_rewards is not None)
        self.group_rewards, self.rollouts = None, []
        return n

    def copy(self) -> "_Entry":
        return _Entry(self.version, self.created_s, self.group_rewards, list(self.rollouts), list(self.successes),
                      list(self.deliveries))


@dataclass
class Arrived:
    """What `collect` returns: per prompt id, per producer, the entry; the peers' capabilities; wait stats."""
    entries: dict[str, dict[str, _Entry]]
    capability: dict[str, float]
    waited_s: float
    complete: float          # share of (prompt, expected producer) pairs complete at return
    dropped: int = 0         # experiences dropped (stale, superseded, evicted) since the last collect


class PeerIndex:
    """The peers' experience by prompt id and producer, and their latest capabilities: what the inbox keeps
    between steps (PeerInbox holds its lock around every call; the bandit testbed uses it directly).

    lockstep: experience below `floor` (set by the caller: step − max_staleness) is not kept. async: see
    the module's docstring (a peer's own version lag, max_age_s, successes kept, at most max_prompts, the
    held batch).
    A redelivered experience (same id) is stored once; policy_stats only update the producer's P̂."""

    def __init__(self, coupling: Coupling = "lockstep", max_staleness: int = 1, max_age_s: float = 0.0,
                 max_prompts: int = 4096, max_successes: int = 8, clock=time.time):
        if coupling not in COUPLINGS:
            raise ValueError(f"coupling {coupling!r} is not one of {COUPLINGS}")
        self.coupling, self.max_staleness, self.max_age_s, self.max_prompts = (coupling, max_staleness,
                                                                               max_age_s, max_prompts)
        self.max_successes = max_successes            # per (prompt, producer), the newest
        self.floor = 0
        self.dropped = 0
        self.entries: dict[str, dict[str, _Entry]] = {}   # insertion order: least recently published first
        self._latest: dict[str, int] = {}                 # producer -> its highest policy version seen
        self.held: set[str] = set()                       # async: the prompts of the batch being rolled out
        self._capability: dict[str, tuple[int, float]] = {}
        self._clock = clock

    def _stale(self, producer: str, version: int, created_s: float) -> bool:
        if version < self.floor:
            return True
        if self.coupling == "lockstep":
            return False
        return (version < self._latest.get(producer, version) - self.max_staleness
                or (self.max_age_s > 0 and self._clock() - created_s > self.max_age_s))

    def add(self, e, delivery_id: str | None = None) -> bool:
        """Index one experience (and the delivery that brought it); False when nothing waits for a step
        (stale, or policy_stats): its delivery can be acked at once."""
        kind = kind_of(e)
        producer, version = e.producer, e.policy_version
        self._latest[producer] = max(version, self._latest.get(producer, version))
        if kind == "policy_stats":
            if version >= self._capability.get(producer, (-1, 0.0))[0]:
                self._capability[producer] = (version, e.policy_stats.capability)
            return False
        created_s = e.created_at.seconds + e.created_at.nanos * 1e-9
        keeps_forever = kind == "success" and self.coupling == "async"
        pid = getattr(e, kind).prompt_id
        held = self.entries.get(pid, {}).get(producer) if pid in self.held else None
        completes_held = held is not None and held.version == version     # a late part of a held group
        if not keeps_forever and not completes_held and self._stale(producer, version, created_s):
            self.dropped += 1
            return False
        entry = self.entries.setdefault(pid, {}).setdefault(producer, _Entry(version, created_s))
        if delivery_id is not None:
            entry.deliveries.append(delivery_id)
        stored = self._store(entry, e, kind, version, created_s)
        if stored:
            self.entries[pid] = self.entries.pop(pid)          # now the most recently published
            self._evict()
        return stored or bool(entry.deliveries)

    def _store(self, entry: _Entry, e, kind: str, version: int, created_s: float) -> bool:
        """Put one experience in its entry; False when it is not new (a redelivery, an older group)."""
        payload = getattr(e, kind)
        if kind == "success":
            if e.experience_id in entry.success_ids:
                return False
            entry.successes.append(payload)
            entry.success_ids.append(e.experience_id)
            if len(entry.successes) > self.max_successes:      # the newest max_successes stay
                del entry.successes[0], entry.success_ids[0]
                self.dropped += 1
            return True
        holds_group = entry.group_rewards is not None or bool(entry.rollouts)
        if version < entry.version and (holds_group or entry.group_ids):   # older than the group held or used
            self.dropped += 1
            return False
        if version != entry.version or not (holds_group or entry.group_ids):  # a newer group replaces it
            self.dropped += entry.drop_group()
            entry.version, entry.created_s, entry.group_ids = version, created_s, set()
        if e.experience_id in entry.group_ids:
            return False
        entry.group_ids.add(e.experience_id)
        entry.created_s = max(entry.created_s, created_s)
        if kind == "group_stats":
            entry.group_rewards = list(payload.rewards)
        else:
            entry.rollouts.append(payload)
        return True

    def _evict(self) -> None:
        while self.coupling == "async" and len(self.entries) > self.max_prompts:
            pid = next((p for p in self.entries if p not in self.held), None)
            if pid is None:
                return
            for entry in self.entries.pop(pid).values():
                self.dropped += entry.drop_group() + len(entry.successes)

    def hold(self, prompt_ids: list[str]) -> None:
        """async: the receiver chose these prompts for its batch. What is stale now is dropped; the rest of their
        peers' experience is kept, however far the peers move on, until `take` (which ends the hold): a slow
        policy's long rollout does not make the groups it chose its batch for stale before it can use them (nor
        the late parts of such a group). lockstep: nothing (its floor is the receiver's own step)."""
        if self.coupling != "async":
            return
        self.held = set()
        self.prune()          # async entries hold no delivery ids (acked on arrival): nothing to ack here
        self.held = set(prompt_ids)

    def prune(self) -> list[str]:
        """Drop what became stale; returns the delivery ids of dropped entries (to ack outside any lock)."""
        stale = []
        for pid, by_producer in list(self.entries.items()):
            if pid in self.held:
                continue
            for producer, entry in list(by_producer.items()):
                if not self._stale(producer, entry.version, entry.created_s):
                    continue
                if self.coupling == "async" and entry.successes:
                    self.dropped += entry.drop_group()
                    continue
                self.dropped += entry.drop_group() + len(entry.successes)
                stale += entry.deliveries
                del by_producer[producer]
            if not by_producer:
                del self.entries[pid]
        return stale

    def take(self, prompt_ids: list[str]) -> dict[str, dict[str, _Entry]]:
        """Remove and return the entries of these prompts. async: their groups are used (a redelivery is not
        taken again) and their successes stay where they are (a rescue may be needed again the next time this
        policy meets the prompt)."""
        self.held = set()
        if self.coupling == "lockstep":
            return {pid: self.entries.pop(pid) for pid in prompt_ids if pid in self.entries}
        taken = {}
        for pid in prompt_ids:
            by_producer = self.entries.get(pid)
            if by_producer is None:
                continue
            taken[pid] = {producer: entry.copy() for producer, entry in by_producer.items()}
            for producer, entry in list(by_producer.items()):
                entry.drop_group()
                entry.deliveries = []
                if not entry.successes:
                    del by_producer[producer]
            if not by_producer:
                del self.entries[pid]
        return taken

    def offered(self, solved: set[str] | frozenset = frozenset()) -> list[str]:
        """The prompts with peer experience, for a peer-guided batch: first those where a peer has a verified
        success and this policy has not solved (`solved`), then the others; most recently published first."""
        rescues, others = [], []
        for pid in reversed(self.entries):
            has_success = any(entry.successes for entry in self.entries[pid].values())
            (rescues if has_success and pid not in solved else others).append(pid)
        return rescues + others

    def capability(self) -> dict[str, float]:
        """Each producer's latest published P̂."""
        return {producer: value for producer, (_, value) in self._capability.items()}

    def take_dropped(self) -> int:
        dropped, self.dropped = self.dropped, 0
        return dropped


def guided_batch(offered: list[str], find, own: list, size: int, share: float) -> tuple[list, int]:
    """A peer-guided batch of `size` problems and how many the peers chose: first up to ⌊share·size⌋ problems of
    the `offered` prompt ids (in their order) that `find(prompt_id)` knows (None: not one of this policy's), then
    the policy's `own` problems (each with a .prompt_id) for the rest."""
    most = int(share * size + 1e-9)                 # float rounding of a share times τ ≈ 1 loses no prompt
    guided: dict[str, object] = {}
    for prompt_id in offered:
        if len(guided) >= most:
            break
        problem = find(prompt_id)
        if problem is not None:
            guided[problem.prompt_id] = problem
    rest = [p for p in own if p.prompt_id not in guided][:size - len(guided)]
    return [*guided.values(), *rest], len(guided)


class PeerInbox:
    """A background subscription to the peers' experience, indexed by prompt (PeerIndex); see the module."""

    def __init__(self, exchange, run_id: str, policy: str, kinds: tuple[str, ...], peers: list[str],
                 max_staleness: int, coupling: Coupling = "lockstep", max_age_s: float = 0.0,
                 max_prompts: int = 4096):
        self.kinds = tuple(sorted({*kinds, "group_stats"}))   # group_stats says how many rollouts to expect
        self.peers, self.max_staleness = list(peers), max_staleness
        self._index = PeerIndex(coupling, max_staleness, max_age_s, max_prompts)
        self._cond = threading.Condition()
        self._error: Exception | None = None
        self._closing = False
        self._sub = exchange.subscribe(run_id, policy, kinds=self.kinds, producers=self.peers, start="earliest",
                                       max_in_flight=1024, max_version_lag=max_staleness,
                                       lag_exempt_kinds=("success",) if coupling == "async" else ())
        self._thread = threading.Thread(target=self._pump, name=f"peers-{policy}", daemon=True)
        self._thread.start()

    @property
    def coupling(self) -> str:
        return self._index.coupling

    def _pump(self) -> None:
        error: Exception = FailedPrecondition("the exchange ended the subscription to the peers' experience")
        try:
            for batch in self._sub.batches():       # one Ack call per message of deliveries, not per delivery
                self._ack([i for delivery in batch for i in self._add(delivery)])
        except Exception as exc:     # noqa: BLE001 - any end of the pump is reported by the next collect()
            error = exc
        finally:
            with self._cond:
                if not self._closing:
                    self._error = error
                self._cond.notify_all()

    def _add(self, delivery) -> list[str]:
        """Store one delivery; returns the delivery ids to ack now (async: all; lockstep: stale, or policy_stats)."""
        with self._cond:
            kept = self._index.add(delivery.experience, None if self.coupling == "async" else delivery.delivery_id)
            if kept:
                self._cond.notify_all()
            return [delivery.delivery_id] if self.coupling == "async" or not kept else []

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

    def offered(self, solved: set[str] | frozenset = frozenset()) -> list[str]:
        """PeerIndex.offered: prompts with peer experience, rescues first."""
        with self._cond:
            stale = self._index.prune()
            offered = self._index.offered(solved)
        self._ack(stale)
        return offered

    def hold(self, prompt_ids: list[str]) -> None:
        """async: PeerIndex.hold, for the batch this policy chose (until the collect that takes it)."""
        with self._cond:
            self._index.hold(prompt_ids)

    def recall(self, successes) -> None:
        """Index verified successes fetched from the exchange's success library (already acked: no delivery)."""
        with self._cond:
            for e in successes:
                self._index.add(e)

    def collect(self, step: int, prompt_ids: list[str], timeout_s: float, stop=lambda: False) -> Arrived:
        """The peers' experience of these prompts: waits until complete, `timeout_s` or stop(), then takes
        what arrived (async: call with timeout_s 0)."""
        start = time.monotonic()
        with self._cond:
            if self.coupling == "lockstep":
                self._index.floor = step - self.max_staleness
            stale = self._index.prune()
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
            dropped = self._index.take_dropped()
        waited = time.monotonic() - start
        self._ack(stale + [d for by_producer in taken.values() for entry in by_producer.values()
                           for d in entry.deliveries])          # an ack is an RPC: never under the lock
        return Arrived(taken, capability, waited, done / expected, dropped)

    def close(self) -> None:
        with self._cond:
            self._closing = True
        self._sub.close()
        self._thread.join(timeout=5)


class Retokenizer:
    """Peers' token ids → this policy's, through THL (`mrl.align_client.AlignClient`); identity for the same tokenizer.

    `missing_thl` ends the error raised when a peer uses another tokenizer and no THL client was given: how to
    give one in the caller's terms (the mrl trainer: its `sharing.align.target`).

    `end_id`: the token this policy ends its own responses with (its EOS). THL maps a peer's final end of
    sequence to a special of the same name when this tokenizer has one (GPT-2's <|endoftext|> to SmolLM2's
    <|endoftext|>), which need not be the end this policy writes (SmolLM2's <|im_end|>); with `end_id` such a
    mapped end becomes `end_id`, so that a peer's response ends as this policy's own would. A response THL
    found cut before its end keeps no end, and one in this policy's own tokenizer stays as the peer wrote it."""

    def __init__(self, tokenizer_id: str, align_client=None,
                 missing_thl: str = "pass an mrl.AlignClient of a THL service (mrl align serve) to retokenize them",
                 end_id: int | None = None):
        self.tokenizer_id, self.client, self.missing_thl, self.end_id = tokenizer_id, align_client, missing_thl, end_id

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
            out[i], chunks[i] = list(a.target_ids), a.residual.chunks
            if self.end_id is not None and a.residual.mapped_specials and out[i]:
                out[i][-1] = self.end_id
        n = len(aligned)
        return out, chunks, {"thl_one_to_one": sum(a.residual.one_to_one_share for a in aligned) / n,
                             "thl_lossless": sum(a.lossless for a in aligned) / n,
                             "thl_tokens_per_chunk": sum(a.residual.mean_target_tokens_per_chunk for a in aligned) / n}
