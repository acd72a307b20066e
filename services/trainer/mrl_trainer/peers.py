"""Peer experience for one policy, in this trainer's terms: the SDK's inbox and THL retokenizer (mrl.peers),
and `to_peer_batch`, which turns what arrived into the sharing modes' PeerBatch.

    inbox = PeerInbox(exchange, run_id, policy, kinds, peers, max_staleness)
    arrived = inbox.collect(step, prompt_ids, timeout_s)     # waits at most timeout_s, never longer
    batch  = to_peer_batch(arrived, prompt_ids, retokenizer)  # peers' responses in this policy's tokens

Coordination (by global prompt id, staleness, acks) is described in mrl.peers.
"""
from mrl import peers as _peers
from mrl.peers import Arrived, PeerIndex, PeerInbox, _Entry  # noqa: F401  (_Entry: tests build Arrived by hand)
from mrl_trainer.sharing import PeerBatch, PeerSample

__all__ = ["PeerInbox", "PeerIndex", "Arrived", "Retokenizer", "to_peer_batch"]


class Retokenizer(_peers.Retokenizer):
    """mrl.peers.Retokenizer, whose missing-THL error names this trainer's setting."""

    def __init__(self, tokenizer_id: str, align_client=None, end_id: int | None = None):
        super().__init__(tokenizer_id, align_client, missing_thl="set sharing.align.target to a THL service "
                                                                 "(mrl align serve) to retokenize them", end_id=end_id)


def to_peer_batch(arrived: Arrived, prompt_ids: list[str], retokenize: Retokenizer) -> tuple[PeerBatch, dict]:
    """The arrived experience as a PeerBatch in this policy's tokens, and stats (peer_wait_s, peers_complete,
    peer_dropped, thl_*)."""
    batch = PeerBatch(capability=dict(arrived.capability))
    pending = []     # (target dict, prompt index, producer, payload, behaviour sequence log-prob)
    for p, pid in enumerate(prompt_ids):
        for producer, entry in arrived.entries.get(pid, {}).items():
            if entry.group_rewards is not None:
                batch.group_rewards.setdefault(p, []).extend(entry.group_rewards)
            for r in entry.rollouts:
                if r.logprobs and len(r.logprobs) == len(r.token_ids):   # ρ needs the behaviour log-probs
                    pending.append((batch.rollouts, p, producer, r, sum(r.logprobs)))
            for s in entry.successes:
                pending.append((batch.successes, p, producer, s, 0.0))
    ids, chunks, stats = retokenize([(x[3].tokenizer_id, list(x[3].token_ids)) for x in pending])
    for (target, p, producer, payload, logp), own_ids, c in zip(pending, ids, chunks):
        target.setdefault(p, []).append(PeerSample(
            producer=producer, prompt_index=p, ids=own_ids, text=payload.response_text, reward=payload.reward,
            behaviour_logp=logp, chunks=c))
    return batch, {"peer_wait_s": arrived.waited_s, "peers_complete": arrived.complete,
                   "peer_dropped": arrived.dropped, **stats}
