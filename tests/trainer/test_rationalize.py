"""SGT's rationalization (sharing.sgt.rationalize): a rescue is the receiver's own verified response, sampled with
the peer's verified answer as a hint, never the peer's text."""
import pytest

from mrl_trainer.config import LossConfig, TrainerConfig
from mrl_trainer.distributed import Ranks
from mrl_trainer.errors import TrainerError
from mrl_trainer.experience import StepBatch
from mrl_trainer.rationalize import hinted, rationalize
from mrl_trainer.rollout.base import Sample
from mrl_trainer.sharing import PeerBatch, PeerSample, Verifier, make_sharing, sharing_config
from mrl.tasks import make_task
from mrl.tasks.base import TaskSpec
from mrl_trainer.trainer import build_trainer
from helpers import tiny_config


@pytest.fixture(scope="module")
def task():
    return make_task(TaskSpec(family="arithmetic", level=2, seed=0))


def verify_with(task):
    def verify(problem, text):
        return float(task.reward(problem, text)), task.extract(problem, text)
    return verify


def failed_batch(task, prompts: int = 2) -> StepBatch:
    problems = task.batch(0, prompts)
    samples = [[Sample(prompt_ids=[1], ids=[5, 6], logprobs=[-1.0, -1.0], text="I do not know.", truncated=False)]
               for _ in problems]
    return StepBatch(step=0, problems=problems, samples=samples, rewards=[[0.0] for _ in problems],
                     answers=[[None] for _ in problems])


def success(p: int, text: str) -> PeerSample:
    return PeerSample(producer="peer", prompt_index=p, ids=[9, 9, 9], text=text, reward=1.0)


def test_a_verified_peer_answer_is_rescued_in_the_receivers_own_words(task):
    batch = failed_batch(task)
    right = int(batch.problems[0].answer)
    wrong = right + 1
    peers = PeerBatch(successes={0: [success(0, f"Answer: {wrong}"), success(0, f"Answer: {right}")],
                                 1: [success(1, f"Answer: {batch.problems[1].answer}")]})
    asked = []

    def sample(questions, n):       # the receiver's hinted samples: one wrong, then one right, in its own form
        asked.extend(questions)
        return [[Sample([1], [7, 8], [-0.5, -0.5], f"The sum is {int(problem.answer) + 3}.", False),
                 Sample([1], [7, 8, 2], [-0.5] * 3, f"The sum is {problem.answer}.", False)][:n]
                for problem, _ in questions]

    out, stats = rationalize(batch, peers, [0], verify=verify_with(task), sample=sample, n=2)
    # only the rescuable prompt 0 is asked, with the answer the verifier extracted from the peer's verified text
    assert asked == [(batch.problems[0], hinted(batch.problems[0].question, str(right)))]
    assert f"Hint: the answer is {right}." in asked[0][1]
    assert stats == {"sgt_rationalized": 1, "sgt_unrationalized": 0, "sgt_rationalized_truncated": 0}
    # the rejected peer success stays for SGT to count; the verified one is replaced by the receiver's own words
    assert [s.text for s in out.successes[0]] == [f"Answer: {wrong}", f"The sum is {right}."]
    assert out.successes[0][1].ids == [7, 8, 2] and out.successes[0][1].producer == "rationalized"
    assert out.successes[1] == peers.successes[1]        # not rescuable: as it came
    sgt = make_sharing(sharing_config(mode="sgt"), LossConfig())
    plan = sgt.plan(batch, out, capability=0.0, verify=Verifier(batch, lambda p, t: verify_with(task)(p, t)[0]))
    assert [(e.prompt_index, e.ids) for e in plan.extras] == [(0, [7, 8, 2]), (1, [9, 9, 9])]
    assert plan.stats["sgt_rejected"] == 1 and plan.stats["sgt_rescued"] == 2


def test_a_prompt_whose_hinted_samples_all_fail_is_not_rescued(task):
    batch = failed_batch(task, prompts=1)
    peers = PeerBatch(successes={0: [success(0, f"Answer: {batch.problems[0].answer}")]})
    out, stats = rationalize(batch, peers, [0], verify=verify_with(task), n=3,
                             sample=lambda questions, n: [[Sample([1], [7], [-1.0], "seven", False)] * n
                                                          for _ in questions])
    assert stats == {"sgt_rationalized": 0, "sgt_unrationalized": 1,
                     "sgt_rationalized_truncated": 0} and out.successes[0] == []


def test_rewrites_that_ended_by_themselves_come_first_and_the_shorter_first(task):
    """SGT keeps the first per_prompt rewrites: one cut at the token limit is used only when none ended by itself
    (then counted in sgt_rationalized_truncated)."""
    batch = failed_batch(task, prompts=2)
    peers = PeerBatch(successes={p: [success(p, f"Answer: {problem.answer}")]
                                 for p, problem in enumerate(batch.problems)})

    def sample(questions, n):
        right = [f"The sum is {problem.answer}" for problem, _ in questions]
        return [[Sample([1], [7] * 9, [-0.1] * 9, right[0] + " and so on", True),
                 Sample([1], [7] * 6, [-0.1] * 6, right[0] + ".", False),
                 Sample([1], [7] * 3, [-0.1] * 3, "No idea.", False),
                 Sample([1], [7] * 4, [-0.1] * 4, right[0] + "!", False)],
                [Sample([1], [8] * 9, [-0.1] * 9, right[1] + " and so", True),
                 Sample([1], [8] * 7, [-0.1] * 7, right[1] + " and", True),
                 Sample([1], [8] * 2, [-0.1] * 2, "No.", False)]]

    out, stats = rationalize(batch, peers, [0, 1], verify=verify_with(task), sample=sample, n=4)
    assert [len(s.ids) for s in out.successes[0]] == [4, 6, 9]
    assert [len(s.ids) for s in out.successes[1]] == [7, 9]
    assert stats == {"sgt_rationalized": 2, "sgt_unrationalized": 0, "sgt_rationalized_truncated": 1}
    sgt = make_sharing(sharing_config(mode="sgt"), LossConfig())
    plan = sgt.plan(batch, out, capability=0.0, verify=Verifier(batch, lambda p, t: verify_with(task)(p, t)[0]))
    assert [len(e.ids) for e in plan.extras] == [4, 7]


def test_peer_successes_the_verifier_rejects_ask_nothing(task):
    batch = failed_batch(task, prompts=1)
    peers = PeerBatch(successes={0: [success(0, f"Answer: {int(batch.problems[0].answer) + 1}")]})

    def sample(questions, n):
        raise AssertionError("nothing to rationalize: nothing is sampled")
    out, stats = rationalize(batch, peers, [0], verify=verify_with(task), sample=sample, n=4)
    assert out is peers and stats == {"sgt_rationalized": 0, "sgt_unrationalized": 0,
                                      "sgt_rationalized_truncated": 0}


def test_the_trainer_samples_its_rewrites_with_its_own_model(tmp_path):
    """A real (tiny, untrained) policy under SGT with rationalize: its hinted samples are generated by its engine
    and checked by its verifier; the untrained policy's fail, so the prompt is not rescued and no peer text is
    trained on. Without rationalize the peers pass unchanged."""
    trainer = build_trainer(TrainerConfig.model_validate(tiny_config(tmp_path, steps=1)))
    try:
        batch = trainer.rollout(0)
        batch.rewards = [[0.0] * len(r) for r in batch.rewards]        # as if every own group failed
        peers = PeerBatch(successes={p: [success(p, f"Answer: {problem.answer}")]
                                     for p, problem in enumerate(batch.problems)})
        assert trainer.rationalize(batch, peers) == (peers, {})        # mode none
        for n, expected in ((0, None), (2, {"sgt_rationalized": 0, "sgt_unrationalized": 2,
                                                 "sgt_rationalized_truncated": 0})):
            trainer.sharing = make_sharing(sharing_config(mode="sgt", sgt={"rationalize": n}), trainer.cfg.loss)
            out, stats = trainer.rationalize(batch, peers)
            if expected is None:
                assert (out, stats) == (peers, {})
            else:
                assert stats == expected and all(out.successes[p] == [] for p in range(len(batch.problems)))
    finally:
        trainer.close()


def test_rationalize_is_refused_under_torchrun(tmp_path):
    config = TrainerConfig.model_validate(tiny_config(tmp_path, sharing={"mode": "sgt", "sgt": {"rationalize": 4}},
                                                      exchange={"target": "127.0.0.1:1", "tokenizer_id": "gpt2"}))
    with pytest.raises(TrainerError, match="rationalize.*torchrun"):
        build_trainer(config, ranks=Ranks(0, 2))
