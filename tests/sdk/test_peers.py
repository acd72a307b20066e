"""mrl.peers.PeerIndex under the async coupling: a peer's own version lag, age, successes kept, eviction,
the peer-guided offer, and what is dropped counted."""
import pytest

from mrl.experience import new_experience
from mrl.peers import PeerIndex, guided_batch
from mrl.v1 import experience_pb2 as pb


def group(producer: str, version: int, prompt_id: str, rewards: list[float], created_s: float = 1000.0):
    """A peer's group_stats and one rollout per reward for one prompt at one version."""
    out = [new_experience("run", producer, version, pb.GroupStats(prompt_id=prompt_id, group_id="g", rewards=rewards),
                          f"{producer}.{version}.{prompt_id}.gs")]
    out += [new_experience("run", producer, version, pb.Rollout(
        prompt_id=prompt_id, response_text=str(i), token_ids=[1], logprobs=[-1.0], reward=r, group_id="g",
        tokenizer_id="gpt2", sample_index=i), f"{producer}.{version}.{prompt_id}.r{i}") for i, r in enumerate(rewards)]
    for e in out:
        e.created_at.FromSeconds(int(created_s))
    return out


def success(producer: str, version: int, prompt_id: str):
    return new_experience("run", producer, version, pb.VerifiedSuccess(
        prompt_id=prompt_id, response_text="ok", token_ids=[1], reward=1.0, tokenizer_id="gpt2"),
        f"{producer}.{version}.{prompt_id}.s")


def index(**kwargs) -> PeerIndex:
    return PeerIndex("async", **{"max_staleness": 2, "clock": lambda: 1000.0, **kwargs})


def add_all(ix: PeerIndex, experiences) -> None:
    for e in experiences:
        ix.add(e)


def test_async_staleness_is_the_peers_own_version_lag_not_the_receivers_step():
    ix = index()
    add_all(ix, group("fast", 50, "p50", [1.0]))        # a receiver at step 3 still takes version 50
    add_all(ix, group("fast", 48, "p48", [0.0]))        # lag 2: kept
    add_all(ix, group("fast", 47, "p47", [0.0, 1.0]))   # lag 3: dropped on arrival (group_stats + 2 rollouts)
    assert set(ix.entries) == {"p50", "p48"} and ix.take_dropped() == 3
    add_all(ix, group("fast", 51, "p51", [1.0]))        # the peer moves on: p48 is now 3 behind
    assert ix.prune() == [] and set(ix.entries) == {"p50", "p51"} and ix.take_dropped() == 2
    assert ix.take_dropped() == 0                        # counted once


def test_async_successes_are_kept_however_old_and_the_group_beside_them_is_not():
    ix = index()
    add_all(ix, group("slow", 0, "p0", [1.0]) + [success("slow", 0, "p0")])
    add_all(ix, group("slow", 9, "p9", [0.0]))
    ix.prune()
    entry = ix.entries["p0"]["slow"]
    assert entry.group_rewards is None and entry.rollouts == [] and [s.prompt_id for s in entry.successes] == ["p0"]
    ix.add(success("slow", 1, "p1"))                    # a success older than the lag, arriving late (a library)
    assert "p1" in ix.entries


def test_lockstep_keeps_its_floor_and_drops_successes_below_it():
    ix = PeerIndex("lockstep", max_staleness=1)
    ix.floor = 4
    add_all(ix, group("peer", 3, "p3", [1.0]) + [success("peer", 3, "p3")])
    assert ix.entries == {} and ix.take_dropped() == 3


def test_async_drops_groups_older_than_max_age():
    ix = index(max_age_s=60)
    add_all(ix, group("peer", 5, "old", [1.0], created_s=900.0) + group("peer", 5, "new", [1.0], created_s=990.0))
    assert set(ix.entries) == {"new"} and ix.take_dropped() == 2


def test_a_newer_group_of_a_prompt_replaces_the_older_and_an_older_one_is_refused():
    ix = index()
    add_all(ix, group("peer", 5, "p", [0.0, 0.0]))
    add_all(ix, group("peer", 6, "p", [1.0]))
    entry = ix.entries["p"]["peer"]
    assert (entry.version, entry.group_rewards, len(entry.rollouts)) == (6, [1.0], 1) and ix.take_dropped() == 3
    add_all(ix, group("peer", 5, "p", [0.0]))           # late: a group older than the one held
    assert (entry.version, entry.group_rewards) == (6, [1.0]) and ix.take_dropped() == 2


def test_async_keeps_at_most_max_prompts_the_least_recently_published_go_first():
    ix = index(max_prompts=2)
    for pid in ("a", "b", "c"):
        add_all(ix, group("peer", 1, pid, [1.0]))
    assert list(ix.entries) == ["b", "c"] and ix.take_dropped() == 2
    add_all(ix, group("peer", 1, "b", [1.0])[1:])       # a redelivery of b's rollout is not news: b stays oldest
    assert list(ix.entries) == ["b", "c"]
    add_all(ix, group("peer", 2, "b", [1.0]))           # b published again: now the newest
    add_all(ix, group("peer", 2, "d", [1.0]))
    assert list(ix.entries) == ["b", "d"]


def test_offered_puts_peer_successes_this_policy_lacks_first_newest_first():
    ix = index()
    add_all(ix, group("peer", 1, "plain-old", [0.0]))
    add_all(ix, group("peer", 1, "rescue-old", [1.0]) + [success("peer", 1, "rescue-old")])
    add_all(ix, group("peer", 1, "solved", [1.0]) + [success("peer", 1, "solved")])
    add_all(ix, group("peer", 1, "rescue-new", [1.0]) + [success("peer", 1, "rescue-new")])
    add_all(ix, group("peer", 1, "plain-new", [0.0]))
    assert ix.offered(solved={"solved"}) == ["rescue-new", "rescue-old", "plain-new", "solved", "plain-old"]


def test_a_guided_batch_takes_the_offered_prompts_first_up_to_the_share_and_the_own_order_after():
    from types import SimpleNamespace as P
    own = [P(prompt_id=f"own{i}") for i in range(4)]
    known = {f"peer{i}": P(prompt_id=f"peer{i}") for i in range(3)}
    offered = ["peer0", "elsewhere", "peer1", "peer2"]          # "elsewhere": not one of this policy's prompts
    ids = lambda batch: [p.prompt_id for p in batch[0]]         # noqa: E731
    assert ids(guided_batch(offered, known.get, own, 4, 0.5)) == ["peer0", "peer1", "own0", "own1"]
    assert guided_batch(offered, known.get, own, 4, 0.5 * (1 - 1e-15))[1] == 2    # a share of τ·0.5 at τ ≈ 1
    assert guided_batch(offered, known.get, own, 4, 0.49)[1] == 1
    assert guided_batch(offered, known.get, own, 4, 0)[1] == 0


def test_an_unknown_coupling_is_refused():
    with pytest.raises(ValueError, match="coupling"):
        PeerIndex("loose")


def test_async_take_consumes_a_group_once_and_keeps_the_successes_for_the_next_meeting():
    ix = index()
    add_all(ix, group("peer", 1, "p", [1.0, 0.0]) + [success("peer", 1, "p")])
    first = ix.take(["p"])["p"]["peer"]
    assert (first.group_rewards, len(first.rollouts), len(first.successes)) == ([1.0, 0.0], 2, 1)
    again = ix.take(["p"])["p"]["peer"]
    assert (again.group_rewards, again.rollouts, len(again.successes)) == (None, [], 1)
    add_all(ix, group("peer", 1, "p", [1.0, 0.0]))      # the same group again (a redelivery) is not used twice
    assert ix.entries["p"]["peer"].group_rewards is None


def test_lockstep_take_removes_everything():
    ix = PeerIndex("lockstep")
    add_all(ix, group("peer", 1, "p", [1.0]) + [success("peer", 1, "p")])
    assert set(ix.take(["p"])) == {"p"} and ix.entries == {}


def test_async_keeps_the_newest_successes_per_prompt_and_producer_and_take_keeps_their_place():
    ix = index(max_successes=3)
    for v in range(10):
        ix.add(success("peer", v, "p"))
    assert [s_id.split(".")[1] for s_id in ix.entries["p"]["peer"].success_ids] == ["7", "8", "9"]
    assert ix.take_dropped() == 7
    ix.add(success("peer", 9, "p"))                     # a redelivery (or a library recall): stored once
    assert len(ix.entries["p"]["peer"].successes) == 3
    add_all(ix, [success("peer", 1, "q")])
    ix.take(["p"])                                      # used, not re-published: q stays the newest
    assert ix.offered() == ["q", "p"]


def test_async_groups_of_a_held_batch_are_judged_when_it_is_chosen_not_when_it_is_taken():
    """A slow receiver picks its batch (guided by what its peer published), then rolls out for a long time while a
    fast peer publishes many versions: the groups it chose its batch for stay until it takes them."""
    ix = index()                                         # max_staleness 2
    add_all(ix, group("fast", 7, "p7", [0.0]))           # fresh on arrival, lag 3 at the hold: dropped by it
    add_all(ix, group("fast", 10, "p10", [1.0, 0.0]))
    assert set(ix.entries) == {"p7", "p10"}
    ix.hold(["p10", "p7", "own"])
    assert set(ix.entries) == {"p10"} and ix.take_dropped() == 2
    for version in range(11, 20):                        # the fast peer moves on during the rollout
        add_all(ix, group("fast", version, f"p{version}", [0.0]))
    assert ix.prune() == [] and "p10" in ix.entries      # held: not pruned, not evicted
    taken = ix.take(["p10", "own"])
    assert taken["p10"]["fast"].group_rewards == [1.0, 0.0] and len(taken["p10"]["fast"].rollouts) == 2
    add_all(ix, group("fast", 10, "p10", [1.0, 0.0]))    # the hold ended with the take: a lag of 9 is stale again
    assert "p10" not in ix.entries


def test_a_held_prompt_is_not_evicted_and_a_newer_group_still_replaces_the_held_one():
    ix = index(max_prompts=2)
    add_all(ix, group("peer", 1, "held", [0.0]))
    ix.hold(["held"])
    add_all(ix, group("peer", 1, "b", [1.0]))
    add_all(ix, group("peer", 1, "c", [1.0]))
    assert list(ix.entries) == ["held", "c"]             # b went, the held prompt stayed
    add_all(ix, group("peer", 2, "held", [1.0]))
    assert ix.take(["held"])["held"]["peer"].group_rewards == [1.0]


def test_the_late_parts_of_a_held_group_are_kept_and_a_hold_is_nothing_under_lockstep():
    ix = index()                                         # max_staleness 2
    gs, *rollouts = group("fast", 1, "p", [1.0, 0.0])
    ix.add(gs)
    ix.hold(["p"])
    for version in range(2, 9):
        add_all(ix, group("fast", version, f"q{version}", [0.0]))
    add_all(ix, rollouts)                                # version 1 is 7 behind, but completes the held group
    assert len(ix.take(["p"])["p"]["fast"].rollouts) == 2
    lockstep = PeerIndex("lockstep", max_staleness=1)
    lockstep.hold(["p"])
    assert lockstep.held == set()
