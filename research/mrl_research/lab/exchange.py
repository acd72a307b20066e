"""Peer experience as the trainer receives it, without the services: publish → arrive → retokenize.

    publish    mrl_trainer.experience.step_experiences(batch, ...)      the four kinds, as protobufs
    arrive     what PeerInbox.collect hands over (mrl.peers):           only the kinds the receiver's mode
               takes (plus group_stats), experience whose version is below (step − max_staleness)
               dropped, the producers' latest policy_stats as capabilities (lockstep)
    AsyncInbox the same under the async coupling: kept across steps within each peer's own version lag
    retokenize mrl_trainer.peers.to_peer_batch with the trainer's Retokenizer, whose THL client is
               InProcessAlign: THL's in-process core (mrl_tokenizer_align.align) instead of the gRPC service

so a PeerBatch here is built by the trainer's own code from the same protobufs; only the transport
(Redis streams, gRPC) is left out. The THL residual statistics (thl_one_to_one, thl_lossless,
thl_tokens_per_chunk) are the trainer's.
"""
import numpy as np

from mrl.align_client import Aligned
from mrl.experience import kind_of
from mrl_tokenizer_align.align import align
from mrl_tokenizer_align.vocab import Vocab
from mrl_trainer.experience import StepBatch, step_experiences
from mrl_trainer.peers import Arrived, PeerIndex, Retokenizer, to_peer_batch
from mrl_trainer.sharing import PeerBatch

__all__ = ["InProcessAlign", "publish", "arrive", "receive", "AsyncInbox"]

RUN_ID = "lab-bandit"


class InProcessAlign:
    """The THL client the trainer's Retokenizer calls (align_batch(jobs) → [Aligned]), over THL's core.

    align() is a pure function of (source vocabulary, ids, target vocabulary), so results are cached."""

    def __init__(self, vocabs: dict[str, Vocab]):
        self.vocabs = vocabs
        self._cache: dict[tuple, Aligned] = {}

    def align_batch(self, jobs) -> list[Aligned]:
        out = []
        for job in jobs:
            key = (job.source_tokenizer_id, tuple(job.source_ids), job.target_tokenizer_id)
            if key not in self._cache:
                a = align(self.vocabs[job.source_tokenizer_id], np.asarray(job.source_ids, dtype=np.int64),
                          self.vocabs[job.target_tokenizer_id])
                self._cache[key] = Aligned(
                    target_ids=a.target_ids[a.response_start:].tolist(), traces={}, text=a.text,
                    residual=a.residual, lossless=a.residual.lossless, source_chunk=a.source_chunk.tolist(),
                    target_chunk=a.target_chunk.tolist())
            out.append(self._cache[key])
        return out


def publish(batch: StepBatch, *, policy: str, version: int, tokenizer_id: str, batch_rewards: list[float],
            window: int, rollouts_total: int) -> list:
    """The experiences a trainer publishes for one step (Trainer.step → step_experiences)."""
    return step_experiences(batch, run_id=RUN_ID, policy=policy, version=version, tokenizer_id=tokenizer_id,
                            batch_rewards=batch_rewards, window=window, rollouts_per_s=0.0, tokens_per_s=0.0,
                            rollouts_total=rollouts_total)


def arrive(experiences: list, *, step: int, prompt_ids: list[str], kinds: tuple[str, ...],
           max_staleness: int) -> Arrived:
    """What PeerInbox.collect(step, prompt_ids, ...) returns once every peer is complete: the kinds it
    subscribes to (its mode's, plus group_stats), indexed by the inbox's own PeerIndex."""
    subscribed = {*kinds, "group_stats"}
    index = PeerIndex()
    index.floor = step - max_staleness
    for e in experiences:
        if kind_of(e) in subscribed:
            index.add(e)
    return Arrived(index.take(prompt_ids), index.capability(), waited_s=0.0, complete=1.0)


def _peer_batch(arrived: Arrived, prompt_ids: list[str], retokenize: Retokenizer) -> tuple[PeerBatch, dict]:
    peers, stats = to_peer_batch(arrived, prompt_ids, retokenize)
    stats.pop("peer_wait_s", None)
    stats.pop("peers_complete", None)
    return peers, stats


def receive(experiences: list, *, step: int, prompt_ids: list[str], kinds: tuple[str, ...], max_staleness: int,
            retokenize: Retokenizer) -> tuple[PeerBatch, dict[str, float]]:
    """The receiver's PeerBatch (its own tokens) and the trainer's peer statistics (thl_* when retokenized)."""
    arrived = arrive(experiences, step=step, prompt_ids=prompt_ids, kinds=kinds, max_staleness=max_staleness)
    return _peer_batch(arrived, prompt_ids, retokenize)


class AsyncInbox:
    """What PeerInbox keeps under the async coupling (mrl.peers), fed in process: the kinds the receiver
    subscribes to, kept across steps in an async PeerIndex; `offered` and `hold` as PeerInbox's, and `receive`
    takes a batch's prompts as collect(…, 0)."""

    def __init__(self, kinds: tuple[str, ...], max_staleness: int):
        self.subscribed = {*kinds, "group_stats"}
        self.index = PeerIndex("async", max_staleness)

    def deliver(self, experiences: list) -> None:
        for e in experiences:
            if kind_of(e) in self.subscribed:
                self.index.add(e)

    def offered(self, solved: set[str] | frozenset = frozenset()) -> list[str]:
        """PeerInbox.offered: what is stale dropped first, then the prompts with peer experience, rescues first."""
        self.index.prune()
        return self.index.offered(solved)

    def hold(self, prompt_ids: list[str]) -> None:
        """PeerInbox.hold: the batch chosen, its peer experience kept until `receive`."""
        self.index.hold(prompt_ids)

    def receive(self, prompt_ids: list[str], retokenize: Retokenizer) -> tuple[PeerBatch, dict[str, float]]:
        self.index.prune()
        arrived = Arrived(self.index.take(prompt_ids), self.index.capability(), waited_s=0.0, complete=1.0,
                          dropped=self.index.take_dropped())
        return _peer_batch(arrived, prompt_ids, retokenize)
