"""The experiment loop: two policies co-trained on the bandit under one sharing mode, per seed; seeds in parallel.

One run (point, mode, seed), both policies in the same mode, T steps; step t as Trainer.step:

    problems      = bandit.batch(t, P)                          the same P contexts for both policies
    batch_k       = G samples per context from π_k (own tokens, behaviour log-probs), rewards by the verifier
    published_k   = step_experiences(batch_k, version t)        staleness s > 0: a batch sampled on the same
                                                                contexts by π_k's snapshot of version t − s
                                                                (its behaviour log-probs, its policy_stats)
    peers_k       = to_peer_batch(arrive(published_j), THL)     only for modes that take peers' experience
    plan_k        = mode.plan(batch_k, peers_k, capability=P̂_k, verify=k's own verifier)
    update        = Learner.learn(batch_k, plan_k)              the trainer's own plan and update (mrl_trainer.
                                                                learner), on the tiny policy

Measured per policy:

    success       greedy success on the C training contexts (the same contexts; a tabular policy has no
                  held-out contexts), every `eval_every` steps and at the end; x-axis: own rollouts t·P·G
    end           greedy success when the run ends, after end_steps own steps: the final success, except for
                  the faster policy under the async coupling, which made speed·T steps in the slower one's T
                  (success at equal wall time, where `success` compares at equal own rollouts)
    reward        the step's batch mean reward (sampled success)
    grad_var      tr Cov[ĝ] = Σ_r ‖ĝ_r − ḡ‖² / (R − 1): ĝ_r = the update gradient (mrl_trainer.update.gradient: own and
                  extra terms, before clipping) on R independent batches (own rollouts and peer experience
                  drawn afresh) at FIXED parameters, at the probe steps; averaged over the probes
    grad_rel_var  tr Cov[ĝ] / ‖ḡ‖² (noise-to-signal), averaged the same way
    stats         every statistic the mode logs (plan.stats, summarize, the trainer's thl_*): the step sum
                  over the run for the mode's `cumulative` ones (e.g. sgt_rescued), else the mean over steps

Competence (Profile): a share `gap` of the C contexts is complementary (half strong for a only, half
for b only), the rest half strong for both, half weak for both; a writes answers plain, b plain with
weight `overlap` and signed ("+37") otherwise, so `overlap` is how much of b's answer mass lies where
a's policy puts its own (and the reverse).
"""
import collections
import copy
import multiprocessing
import time
from dataclasses import dataclass, field, replace

import numpy as np
import torch
from pydantic import ValidationError

from mrl.errors import FailedPrecondition
from mrl.peers import guided_batch
from mrl_research.lab.bandit import Bandit, Profile, TabularPolicy, extract, reward
from mrl_research.lab.exchange import AsyncInbox, InProcessAlign, publish, receive
from mrl_research.lab.point import Point, Settings
from mrl_launcher.variants import UNGUARDED, variant_settings
from mrl_tokenizer_align.catalog import cached_paths
from mrl_tokenizer_align.vocab import load_vocab
from mrl_trainer.config import LossConfig, apply_overrides
from mrl_trainer.experience import StepBatch
from mrl_trainer.learner import Learner
from mrl_trainer.peers import Retokenizer
from mrl_trainer.sharing import PeerBatch, make_sharing, sharing_config
from mrl_trainer.update import gradient

__all__ = ["POLICIES", "profiles", "mode_config", "run_one", "run_points", "tuned_learning_rates", "team_final"]

POLICIES = ("a", "b")


def profiles(point: Point, settings: Settings, seed: int) -> tuple[Profile, Profile]:
    """a's and b's competence and formats (module docstring); the same for every mode at a seed."""
    C = settings.contexts
    order = np.random.default_rng([seed, 3]).permutation(C)
    n_comp = 2 * round(point.gap * C / 2)
    half, both = n_comp // 2, (C - n_comp) // 2
    a, b = np.zeros(C, dtype=bool), np.zeros(C, dtype=bool)
    a[order[:half]] = True
    b[order[half:n_comp]] = True
    a[order[n_comp:n_comp + both]] = b[order[n_comp:n_comp + both]] = True
    common = dict(p_strong=settings.p_strong, p_weak=settings.p_weak, p_distract=settings.p_distract)
    return (Profile(tuple(a.tolist()), {"plain": 1.0}, **common),
            Profile(tuple(b.tolist()), {"plain": point.overlap, "signed": 1.0 - point.overlap}, **common))


# --- per-process caches ------------------------------------------------------------------------------------
_VOCABS: dict = {}
_ALIGN: list = []


def _vocabs(tokenizers: str) -> dict:
    paths = cached_paths()
    for tid in tokenizers.split("/"):
        if tid not in _VOCABS:
            if tid not in paths:
                raise FailedPrecondition(f"tokenizer {tid!r} is not in the tokenizer cache; cached: "
                                         f"{', '.join(paths) or 'none'} (make tokenizers)")
            _VOCABS[tid] = load_vocab(tid, paths[tid])
    return _VOCABS


def _aligner() -> InProcessAlign:
    if not _ALIGN:
        _ALIGN.append(InProcessAlign(_VOCABS))
    return _ALIGN[0]


# --- one run -----------------------------------------------------------------------------------------------
@dataclass
class _Policy:
    name: str
    tokenizer_id: str
    model: TabularPolicy
    optimizer: torch.optim.Optimizer
    sharing: object
    generator: np.random.Generator
    batch_rewards: list = field(default_factory=list)
    rollouts_total: int = 0
    history: collections.deque = None     # (version, parameters, batch_rewards) of the last s + 1 versions
    records: list = field(default_factory=list)
    curve: list = field(default_factory=list)
    probes: list = field(default_factory=list)
    end: tuple[int, float] | None = None       # (own steps made, greedy success) when the run ends
    inbox: AsyncInbox | None = None            # async coupling: the peer's experience, kept across steps
    alone: bool = False                        # a `-alone` control: takes no peer experience
    solved: set = field(default_factory=set)   # async: prompts own samples solved (guidance prefers others)
    learner: Learner | None = None             # its books are the policy's batch_rewards and rollouts_total


@dataclass
class _Books:
    """A probe's books: a copy of the policy's, so that the probes never touch the run's."""
    batch_rewards: list
    rollouts_total: int


def _rollout(model: TabularPolicy, problems, group_size: int, generator, step: int) -> StepBatch:
    contexts = [p.meta["context"] for p in problems for _ in range(group_size)]
    flat = model.generate(contexts, generator)
    samples = [flat[i * group_size:(i + 1) * group_size] for i in range(len(problems))]
    rewards = [[reward(p, s.text) for s in group] for p, group in zip(problems, samples)]
    answers = [[extract(p, s.text) for s in group] for p, group in zip(problems, samples)]
    return StepBatch(step=step, problems=problems, samples=samples, rewards=rewards, answers=answers)


def _greedy_success(model: TabularPolicy, bandit: Bandit) -> float:
    samples = model.generate(list(range(len(bandit))), None, greedy=True)
    return sum(reward(p, s.text) for p, s in zip(bandit.problems, samples)) / len(bandit)


def _snapshot(model: TabularPolicy) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


class _Swapped:
    """Sample from a snapshot of the parameters, then put the current ones back."""

    def __init__(self, model: TabularPolicy, snapshot: list[torch.Tensor]):
        self.model, self.snapshot = model, snapshot

    def __enter__(self):
        self.saved = [p.data for p in self.model.parameters()]
        for p, value in zip(self.model.parameters(), self.snapshot):
            p.data = value

    def __exit__(self, *exc):
        for p, value in zip(self.model.parameters(), self.saved):
            p.data = value


def _published(producer: _Policy, batch: StepBatch, problems, point: Point, t: int, generator, window: int,
               fresh: bool = False) -> list:
    """What the producer publishes for step t's prompts: its own batch (s = 0), or a batch sampled by its
    version t − s (s > 0). `fresh`: a new batch even at s = 0 (gradient probes)."""
    s = point.staleness
    if s == 0 and not fresh:
        return publish(batch, policy=producer.name, version=t, tokenizer_id=producer.tokenizer_id,
                       batch_rewards=producer.batch_rewards, window=window, rollouts_total=producer.rollouts_total)
    wanted = max(t - s, 0)
    version, params, rewards = next(((v, w, r) for v, w, r in producer.history if v == wanted),
                                    (t, [p.data for p in producer.model.parameters()], producer.batch_rewards or [0.0]))
    with _Swapped(producer.model, params):
        old = _rollout(producer.model, problems, point.group_size, generator, t)
    return publish(old, policy=producer.name, version=version, tokenizer_id=producer.tokenizer_id,
                   batch_rewards=rewards, window=window, rollouts_total=producer.rollouts_total)


def _receive(k: _Policy, batch: StepBatch, experiences: list, t: int, max_staleness: int) -> tuple[PeerBatch, dict]:
    """lockstep: the receiver's PeerBatch (its own tokens, through THL) of the peer's experiences, and the stats."""
    if not k.sharing.kinds or k.alone:
        return PeerBatch(), {}
    return receive(experiences, step=t, prompt_ids=[p.prompt_id for p in batch.problems], kinds=k.sharing.kinds,
                   max_staleness=max_staleness, retokenize=Retokenizer(k.tokenizer_id, _aligner()))


def _probe(pols: list, k: int, problems_of, point: Point, settings: Settings, loss: LossConfig, t: int, seed: int,
           window: int, max_staleness: int) -> dict:
    """tr Cov and ‖mean‖² of policy k's update gradient over R fresh batches at its current parameters. Each
    batch is planned by a copy of k's sharing mode, so a mode's state (HACPO's capability window) never sees
    the probes."""
    peer = pols[1 - k]
    gen = np.random.default_rng([seed, 23, t, k])
    grads = []
    for r in range(settings.probes):
        me = copy.copy(pols[k])
        me.sharing = copy.deepcopy(me.sharing)
        learner = replace(me.learner, sharing=me.sharing, books=_Books(list(me.batch_rewards), me.rollouts_total))
        problems = problems_of(t * 1_000 + 500 + r)
        batch = _rollout(me.model, problems, point.group_size, gen, t)
        learner.note(batch)
        experiences = _published(peer, batch, problems, point, t, gen, window, fresh=True) \
            if me.sharing.kinds and not me.alone else []
        peers, _ = _receive(me, batch, experiences, t, max_staleness)
        plan = learner.plan(batch, peers)
        grads.append(gradient(me.model.completion_logprobs, list(me.model.parameters()), me.sharing, loss, batch,
                              plan, max_tokens=settings.max_new_tokens))
    G = torch.stack(grads)
    mean = G.mean(0)
    var = float(((G - mean) ** 2).sum() / max(len(grads) - 1, 1))
    return {"grad_var": var, "grad_mean_sq": float((mean ** 2).sum())}


def _summary(records: list[dict], cumulative: frozenset) -> dict:
    """Per-step records → the run's statistics: sums for cumulative stats, means otherwise."""
    values: dict[str, list[float]] = {}
    for r in records:
        for key, v in r.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                values.setdefault(key, []).append(float(v))
    return {key: (sum(v) if key in cumulative else sum(v) / len(v)) for key, v in values.items()}


ALONE = "-alone"


def _suffixes(spec: str) -> tuple[str, bool, bool]:
    """A spec without its suffixes, in either order, and which it had: (body, `-unguarded`, `-alone`).
    `-alone` (`hacpo-alone`): the mode as configured, its guard included, with no peer experience (both policies
    publish and receive nothing), the control that tells the mode's sharing from the rest of its update (every
    mode's own loss is the trainer's, so each is solo alone)."""
    found = {UNGUARDED: False, ALONE: False}
    while suffix := next((s for s in found if spec.endswith(s) and not found[s]), None):
        spec, found[suffix] = spec[:-len(suffix)], True
    return spec, found[UNGUARDED], found[ALONE]


def mode_config(spec: str, **common):
    """A mode spec (mrl_launcher.variants: `sgt:lam=0.2`, `sgt-unguarded`) → its validated `sharing:` section;
    a spec ending in `-alone` takes no peer experience (_suffixes; its config is the mode's).
    FailedPrecondition on a bad spec."""
    body, unguarded, _ = _suffixes(spec)
    settings = variant_settings(body + (UNGUARDED if unguarded else ""))
    mode = settings["sharing.mode"]
    try:
        return sharing_config(**apply_overrides({}, {k.removeprefix("sharing."): v for k, v in settings.items()}),
                              **common)
    except (ValidationError, TypeError) as exc:
        where = ".".join(map(str, exc.errors()[0]["loc"])) if isinstance(exc, ValidationError) else "sharing"
        message = exc.errors()[0]["msg"] if isinstance(exc, ValidationError) else str(exc)
        raise FailedPrecondition(f"{spec!r} is not a valid {mode} variant: {message} (at {where})") from exc


def _step(k: _Policy, batch: StepBatch) -> None:
    """A policy's books after sampling a batch (mrl_trainer.learner), and its version history."""
    k.learner.note(batch)
    k.history.append((batch.step, _snapshot(k.model), list(k.batch_rewards)))


def _learn(k: _Policy, batch: StepBatch, peers: PeerBatch, peer_stats: dict) -> dict:
    """The receiver's plan and update through its Learner, the trainer's own; the step's record."""
    stats = k.learner.learn(batch, k.learner.plan(batch, peers))
    return {"reward_mean": k.batch_rewards[-1], **peer_stats, **stats}


def _run_lockstep(pols: list, cfg, point: Point, settings: Settings, bandit: Bandit, loss: LossConfig, window: int,
                  seed: int) -> list[int]:
    """Both policies step together on the same contexts (the module docstring); returns the eval steps."""
    peer_gen = np.random.default_rng([seed, 19])
    probe_steps = sorted({min(int(f * settings.steps), settings.steps - 1) for f in settings.probe_at})
    problems_of = lambda step: bandit.batch(step, settings.prompts_per_step)  # noqa: E731
    eval_steps = []
    for t in range(settings.steps + 1):
        if t % settings.eval_every == 0 or t == settings.steps:
            eval_steps.append(t)
            for k in pols:
                k.curve.append(_greedy_success(k.model, bandit))
        if t == settings.steps:
            break
        if settings.probes > 1 and t in probe_steps:
            for i in range(2):
                pols[i].probes.append(_probe(pols, i, problems_of, point, settings, loss, t, seed, window,
                                             cfg.max_staleness))
        problems = problems_of(t)
        batches = [_rollout(k.model, problems, point.group_size, k.generator, t) for k in pols]
        for k, batch in zip(pols, batches):
            _step(k, batch)
        published = [_published(k, b, problems, point, t, peer_gen, window) if cfg.mode != "none" and not k.alone
                     else [] for k, b in zip(pols, batches)]
        for i, k in enumerate(pols):
            peers, peer_stats = _receive(k, batches[i], published[1 - i], t, cfg.max_staleness)
            k.records.append(_learn(k, batches[i], peers, peer_stats))
    return eval_steps


def _guided(k: _Policy, bandit: Bandit, t: int, size: int, share: float) -> tuple[list, int]:
    """As Trainer.problems under the async coupling: up to ⌊share·P⌋ contexts the peer published (its successes
    k has not solved first), then step t's own schedule for the rest; their peer experience held (PeerIndex.hold)."""
    by_id = {p.prompt_id: p for p in bandit.problems}
    problems, guided = guided_batch(k.inbox.offered(k.solved), by_id.get, bandit.batch(t, size), size, share)
    k.inbox.hold([p.prompt_id for p in problems])
    return problems, guided


def _run_async(pols: list, cfg, point: Point, settings: Settings, bandit: Bandit, loss: LossConfig,
               window: int) -> list[int]:
    """The async coupling: a steps `point.speed` times per step of b, each on its own schedule (plus the
    peer-guided contexts), taking what the other has published so far (AsyncInbox). A step has a duration, as in
    the trainer, where a slow policy's rollout lasts while its peer steps: a step of a lasts 1 tick, one of b
    `speed`. A step chooses its contexts when it starts (and holds their peer experience, PeerIndex.hold) and
    publishes and takes its peer's experience when it ends; at the same tick steps end before others start, a
    before b. Each policy is measured over its own first `steps` steps (its curve at its own rollouts); a keeps
    training and publishing until b has made its `steps`, as a faster policy does in a run of fixed wall time.
    Returns the eval steps."""
    for k in pols:
        k.inbox = AsyncInbox(k.sharing.kinds, cfg.max_staleness) if k.sharing.kinds and not k.alone else None
    durations = (1, point.speed)
    made = [settings.steps * point.speed // d for d in durations]
    events = [(t * d + d * ends, 1 - ends, i, t) for i, d in enumerate(durations)
              for t in range(made[i]) for ends in (0, 1)]
    chosen: list = [None, None]
    eval_steps = [t for t in range(settings.steps + 1) if t % settings.eval_every == 0 or t == settings.steps]
    for _, starts, i, t in sorted(events):
        k, peer = pols[i], pols[1 - i]
        if starts:
            if t in eval_steps:
                k.curve.append(_greedy_success(k.model, bandit))
            chosen[i] = (_guided(k, bandit, t, settings.prompts_per_step, k.sharing.guided_share()) if k.inbox
                         else (bandit.batch(t, settings.prompts_per_step), 0))
            continue
        problems, guided = chosen[i]
        batch = _rollout(k.model, problems, point.group_size, k.generator, t)
        _step(k, batch)
        k.solved |= {p.prompt_id for p, rewards in zip(problems, batch.rewards) if max(rewards) >= 1.0}
        if peer.inbox is not None:
            peer.inbox.deliver(publish(batch, policy=k.name, version=t, tokenizer_id=k.tokenizer_id,
                                       batch_rewards=k.batch_rewards, window=window, rollouts_total=k.rollouts_total))
        peers, peer_stats = PeerBatch(), {}
        if k.inbox is not None:
            peers, peer_stats = k.inbox.receive([p.prompt_id for p in problems],
                                                Retokenizer(k.tokenizer_id, _aligner()))
            peer_stats["peer_guided"] = guided
        record = _learn(k, batch, peers, peer_stats)
        if t < settings.steps:                  # a beyond its measured steps feeds b, and is not measured
            k.records.append(record)
    for k, steps in zip(pols, made):
        k.end = (steps, _greedy_success(k.model, bandit))
        if steps == settings.steps:             # the last eval (a policy that went on had it before its next step)
            k.curve.append(k.end[1])
    return eval_steps


def run_one(point: Point, settings: Settings, mode: str, seed: int) -> dict:
    """One seed of one mode (a spec: mode_config) at one point: curves, rewards, statistics and gradient probes
    of both policies."""
    cpu = time.process_time()
    tokenizer_ids = point.tokenizers.split("/")
    vocabs = _vocabs(point.tokenizers)
    bandit = Bandit(settings.contexts, seed)
    loss = LossConfig(lr=settings.lr, micro_batch_tokens=settings.micro_batch_tokens)
    cfg = mode_config(mode, max_staleness=max(1, point.staleness))
    window = cfg.window
    pols = []
    for k, (name, tid, profile) in enumerate(zip(POLICIES, tokenizer_ids, profiles(point, settings, seed))):
        model = TabularPolicy(vocabs[tid], bandit, profile, seed=seed * 2 + k, noise=settings.noise,
                              max_new_tokens=settings.max_new_tokens, interference=point.interference)
        pols.append(_Policy(name, tid, model, torch.optim.AdamW(model.parameters(), lr=loss.lr,
                                                                weight_decay=loss.weight_decay),
                            make_sharing(cfg, loss), np.random.default_rng([seed, 17, k]),
                            history=collections.deque(maxlen=point.staleness + 1), alone=_suffixes(mode)[2]))
        me = pols[-1]
        me.learner = Learner(me.sharing, model.completion_logprobs, list(model.parameters()), me.optimizer, loss,
                             books=me, reward=reward, max_tokens=settings.max_new_tokens)
    P, G = settings.prompts_per_step, point.group_size
    if cfg.coupling == "async":
        eval_steps = _run_async(pols, cfg, point, settings, bandit, loss, window)
    else:
        eval_steps = _run_lockstep(pols, cfg, point, settings, bandit, loss, window, seed)
    out = {"mode": mode, "seed": seed, "eval_steps": eval_steps, "cpu_s": time.process_time() - cpu,
           "rollouts": [t * P * G for t in eval_steps], "policies": {}}
    for k in pols:
        probes = k.probes
        end_steps, end = k.end or (settings.steps, k.curve[-1])      # lockstep: the run ends at the final eval
        out["policies"][k.name] = {
            "tokenizer": k.tokenizer_id, "curve": k.curve, "reward": [r["reward_mean"] for r in k.records],
            "end_steps": end_steps, "end": end,
            "stats": _summary(k.records, k.sharing.cumulative),
            "grad_var": sum(p["grad_var"] for p in probes) / len(probes) if probes else None,
            "grad_rel_var": (sum(p["grad_var"] / max(p["grad_mean_sq"], 1e-30) for p in probes) / len(probes)
                             if probes else None)}
    return out


# --- many runs ---------------------------------------------------------------------------------------------
def _worker_init() -> None:
    torch.set_num_threads(1)


def _work(task):
    index, point, settings, mode, seed = task
    return index, run_one(point, settings, mode, seed)


def run_points(points: list[Point], settings: Settings | list[Settings], modes: list[str], seeds: list[int],
               workers: int, on_point=lambda index, runs: None) -> list[dict]:
    """Every (point, mode, seed), `workers` processes; on_point(index, {mode: [runs by seed]}) as each point ends.
    `settings`: the same for every point, or one per point (a learning rate tuned per point: tuned_learning_rates)."""
    for m in modes:
        mode_config(m)            # fail early on a bad spec
    for p in points:
        _vocabs(p.tokenizers)     # fail early on a missing tokenizer
    per_point = settings if isinstance(settings, list) else [settings] * len(points)
    tasks = [(i, p, per_point[i], m, s) for i, p in enumerate(points) for s in seeds for m in modes]
    results: list[dict] = [{m: [] for m in modes} for _ in points]
    left = [len(seeds) * len(modes)] * len(points)

    def take(index: int, run: dict) -> None:
        results[index][run["mode"]].append(run)
        left[index] -= 1
        if left[index] == 0:
            for m in modes:
                results[index][m].sort(key=lambda r: r["seed"])
            on_point(index, results[index])

    if workers <= 1:
        _worker_init()
        for task in tasks:
            take(*_work(task))
        return results
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["mrl_research.lab.run"])
    with ctx.Pool(workers, initializer=_worker_init) as pool:
        for index, run in pool.imap_unordered(_work, tasks, chunksize=1):
            take(index, run)
    return results


def team_final(run: dict) -> float:
    """A run's final success: its two policies' greedy success at the last eval, averaged."""
    return sum(run["policies"][p]["curve"][-1] for p in POLICIES) / len(POLICIES)


def tuned_learning_rates(points: list[Point], settings: Settings, grid: list[float], seeds: list[int],
                         workers: int) -> list[dict]:
    """Solo's own learning rate at each point, so that every mode is compared with solo GRPO at its best: solo
    (`none`) runs on `seeds` (tuning seeds, never the reported ones) at every rate of `grid`, and the point takes

        lr* = argmax_lr  mean_seeds final success of solo at lr        (the smallest rate among equal means)

    Per point: {"lr": lr*, "solo_final": {lr: that mean, for each rate of the grid}}."""
    rates = sorted(set(grid))
    expanded = [(p, replace(settings, lr=lr)) for p in points for lr in rates]
    runs = run_points([p for p, _ in expanded], [s for _, s in expanded], ["none"], seeds, workers)
    tuned = []
    for i in range(len(points)):
        finals = {lr: sum(map(team_final, runs[i * len(rates) + j]["none"])) / len(seeds)
                  for j, lr in enumerate(rates)}
        tuned.append({"lr": max(rates, key=lambda lr: finals[lr]), "solo_final": finals})
    return tuned
