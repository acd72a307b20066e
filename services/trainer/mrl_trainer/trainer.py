"""The training loop of one policy: rollout → reward → publish → peers → update → checkpoint.

    step t:  problems   = task.batch(t, P)                       lockstep: same prompts for every policy at step t
                                                                 async: up to ⌊guided_share·τ·P⌋ of them replaced
                                                                 by prompts the peers published (problems();
                                                                 τ the guard's trust, 1 unguarded)
             y_1..y_G   ~ π_old(· | x)                           engine.generate, behaviour log-probs kept
             R_i        = verifier(x, y_i) ∈ [0, 1]
             publish    rollouts, group_stats, successes, policy_stats (when an exchange is configured)
             peers      what the peers published for these prompt ids (lockstep: waited for at most
                        peer_wait_s; async: no wait), retokenized by THL (modes other than none; mrl.peers);
                        SGT with rationalize: the rescuable prompts' successes sampled again by this policy
                        with the peer's verified answer as a hint (rationalize.py)
             plan       the sharing mode's advantages and extra sequences (sharing/): none is
                        A_i = (R_i − mean R) / (std R + ε)       (Dr.GRPO: no std)
             θ ← θ − lr ∇ L(θ)                                   L = the mode's own loss (GRPO / GSPO, DAPO
                                                                 clip-higher, k3 KL when beta > 0) + its extra terms
             checkpoint every `checkpoint.every` steps

Rollout and update each run inside a scheduler lease when `scheduler` is configured (MWRA).

Under torchrun the policy is sharded over the ranks by FSDP2 (distributed.py): each rank generates and
verifies its block of the prompts, rank 0 alone publishes, takes the peers' experience, plans, holds the
leases, logs and prints, and every rank takes its deal of the update.

The batch is split into micro-batches of at most `loss.micro_batch_tokens` padded tokens; each
micro-batch loss is normalised by the whole batch's totals, so the accumulated gradient equals the
full-batch gradient. With μ = updates_per_step = 1, π_old is π_θ detached (no extra forward).
"""
import collections
import contextlib
import copy
import hashlib
import logging
import random
import time

import numpy as np
import torch

from mrl.errors import MrlError
from mrl.experience import validate
from mrl.peers import guided_batch
from mrl.prompts import prompt_ids
from mrl_trainer.checkpoint import TrainState, latest_checkpoint, load_checkpoint, save_checkpoint
from mrl_trainer.config import TrainerConfig
from mrl_trainer.connections import align_client, scheduler_client
from mrl_trainer.distributed import Ranks, shard
from mrl_trainer.errors import TrainerError
from mrl_trainer.experience import StepBatch, step_experiences
from mrl_trainer.learner import Learner
from mrl_trainer.logprobs import completion_logprobs
from mrl_trainer.metrics import MetricsSink
from mrl_trainer.optimizer import adamw
from mrl_trainer.outbox import Outbox
from mrl_trainer.peers import PeerInbox, Retokenizer, to_peer_batch
from mrl_trainer.policy import forward_dtype, load_policy
from mrl_trainer.rationalize import rationalize
from mrl_trainer.rollout import SamplingParams, make_engine
from mrl_trainer.sft import warm_start
from mrl_trainer.sharing import PeerBatch, Plan, SharingMode, make_sharing
from mrl.tasks import Problem, make_task
from mrl_trainer.tracking import open_trackers

__all__ = ["Trainer", "build_trainer", "prepare_warm_start", "lease_size"]

log = logging.getLogger("mrl.trainer")


def _step_line(step: int, steps: int, record: dict) -> str:
    """One log line per step (when the progress bar is off): reward, time, and the sharing mode's counts."""
    shown = {"peer_samples": "peer samples", "sgt_rescued": "rescued", "sgt_rejected": "rejected",
             "thl_one_to_one": "THL 1:1", "peers_complete": "peers complete"}
    extra = "".join(f", {label} {record[k]:.3g}" for k, label in shown.items() if k in record)
    return (f"step {step}/{steps}: reward {record['reward_mean']:.3f}, rollout {record['rollout_s']:.1f} s, "
            f"update {record['update_s']:.1f} s{extra}")


def build_trainer(config: TrainerConfig, exchange=None, ranks: Ranks = Ranks(),
                  should_stop=lambda: False) -> "Trainer":
    """The Trainer of `config`, with every collaborator made from it.

    The policy is loaded (resumed from the latest checkpoint in checkpoint.dir when there is one,
    else warm-started when `warm_start` is set), then its optimizer, task and sharing mode; with a
    sharing mode that takes peers' experience, the peer inbox on `exchange` and the THL client;
    with `scheduler` configured, the lease client; the metrics sink. `exchange`: an
    mrl.ExchangeClient to publish to and subscribe from (None: solo); it stays the caller's to close,
    everything else closes with the trainer. `should_stop` cuts a warm start short (sft.WarmStartStopped; not
    under torchrun). Under torchrun (`ranks` from distributed.setup) every rank builds one: the model (and the
    KL reference) sharded, and only rank 0 with the exchange, the peer inbox, the scheduler client and the
    metrics sink.
    """
    device = _device(config)
    model, tokenizer = _seeded_policy(config, device)
    task = make_task(config.task)
    found = latest_checkpoint(config.checkpoint.dir) if config.checkpoint.resume else None
    if config.warm_start and not found:
        for turn in (True, False):     # rank 0 first: it trains and caches, the others then load the cache
            if ranks.main == turn:
                # sharded, the other ranks wait in the barrier: a rank 0 that stopped alone would leave them there
                _warm_start(config, model, tokenizer, task, device, (lambda: False) if ranks.sharded else should_stop)
            ranks.barrier()
    # the KL anchor is the initial policy (after any warm start), never a resumed checkpoint's weights
    reference = copy.deepcopy(model).eval().requires_grad_(False) if config.loss.beta > 0 else None
    if ranks.sharded:
        shard(model)
        if reference is not None:
            shard(reference)
    optimizer = adamw(model, config.loss)
    state = load_checkpoint(found, model, optimizer, ranks) if found else TrainState()
    sharing = make_sharing(config.sharing, config.loss)
    if sharing.rationalizes() and ranks.world > 1:
        raise TrainerError("sharing.sgt.rationalize samples on rank 0 alone, which a model sharded over "
                           f"{ranks.world} ranks cannot: set it to 0 under torchrun")
    closing = contextlib.ExitStack()
    try:
        inbox = retokenize = scheduler = metrics = None
        if sharing.kinds and ranks.main:
            if exchange is None:
                raise TrainerError(f"sharing mode {sharing.name!r} takes peers' experience: pass an exchange client")
            inbox = closing.enter_context(contextlib.closing(PeerInbox(
                exchange, config.run_id, config.policy, sharing.kinds, config.sharing.peers,
                config.sharing.max_staleness, coupling=config.sharing.coupling, max_age_s=config.sharing.max_age_s,
                max_prompts=config.sharing.max_prompts)))
            thl = closing.enter_context(align_client(config)) if config.sharing.align is not None else None
            retokenize = Retokenizer(config.exchange.tokenizer_id, thl, end_id=tokenizer.eos_token_id)
        if config.scheduler and ranks.main:
            scheduler = closing.enter_context(scheduler_client(config))
        if ranks.main:
            trackers = open_trackers(config.tracking, config.run_id, config.policy, config.model_dump(mode="json"),
                                     closing)
            metrics = MetricsSink(config.policy, config.metrics.jsonl or f"{config.checkpoint.dir}/metrics.jsonl",
                                  config.metrics.prometheus_port, trackers)
            closing.callback(metrics.close)
        return Trainer(config, model=model, tokenizer=tokenizer, task=task, optimizer=optimizer, sharing=sharing,
                       metrics=metrics, state=state, resumed_from=found, reference=reference, exchange=exchange,
                       inbox=inbox, retokenize=retokenize, scheduler=scheduler, closing=closing, ranks=ranks)
    except BaseException:      # what was opened (inbox thread, clients, metrics port) is closed again
        closing.close()
        raise


def _device(config: TrainerConfig) -> torch.device:
    return torch.device("cuda" if config.device == "auto" and torch.cuda.is_available()
                        else "cpu" if config.device == "auto" else config.device)


def _seeded_policy(config: TrainerConfig, device: torch.device):
    """(model, tokenizer) of config.model, with Python's and NumPy's RNGs seeded first. A model built from scratch
    takes its initial weights from warm_start.seed when that is set (the one cached warm start that serves every run
    seed starts from them, whichever run trains it), else from the run's seed."""
    random.seed(config.seed)
    np.random.seed(config.seed)
    fixed = config.warm_start.seed if config.warm_start else None
    return load_policy(config.model, device, seed=config.seed if fixed is None else fixed)


def lease_size(config: TrainerConfig, ranks: Ranks) -> int:
    """Devices per scheduler lease (0 without a scheduler): one per rank under torchrun, else scheduler.devices;
    TrainerError when scheduler.device_ids does not name exactly that many (checked before any connection is made)."""
    s = config.scheduler
    if s is None:
        return 0
    size = ranks.world if ranks.sharded else s.devices
    if s.device_ids is not None and len(s.device_ids) != size:
        each = (f"the run has {size} rank(s) under torchrun: list each rank's device, in rank order"
                if ranks.sharded else f"scheduler.devices is {size}: list one id per device of a lease")
        raise TrainerError(f"scheduler.device_ids lists {len(s.device_ids)} device(s) but {each}")
    return size


def prepare_warm_start(config: TrainerConfig, should_stop=lambda: False) -> str:
    """Do what build_trainer would do first, the warm start into the cache, and nothing else, so that a launcher
    can warm-start every policy before any of them takes its first RL step. Returns "none" (no warm start set),
    "uncached" (warm_start.cache is false: build_trainer trains it itself, so nothing is done here), "resumes" (a
    checkpoint will be resumed instead), "cached" or "trained"; sft.WarmStartStopped if stopped."""
    if not config.warm_start:
        return "none"
    if not config.warm_start.cache:
        return "uncached"
    if config.checkpoint.resume and latest_checkpoint(config.checkpoint.dir):
        return "resumes"
    device = _device(config)
    model, tokenizer = _seeded_policy(config, device)
    stats = _warm_start(config, model, tokenizer, make_task(config.task), device, should_stop)
    return "cached" if stats["cached"] else "trained"


def _warm_start(config: TrainerConfig, model, tokenizer, task, device, should_stop) -> dict:
    """The supervised warm start, cached by model, the task it trains on and warm-start settings (sft.py); its
    stats. It trains on warm_start.task when set (else the RL task `task`) with warm_start.seed when set (else the
    run's seed), so runs whose RL tasks differ (another task seed, another mixture) share a warm start on one
    task."""
    spec = config.warm_start
    trained = spec.task or config.task
    key = hashlib.blake2b(f"{config.model.model_dump_json()}|{trained.model_dump_json()}".encode(),
                          digest_size=8).hexdigest()
    stats = warm_start(model, tokenizer, make_task(spec.task) if spec.task else task, spec,
                       system_prompt=config.system_prompt, seed=config.seed if spec.seed is None else spec.seed,
                       cache_key=key, device=device, should_stop=should_stop)
    log.info("warm start: %s", "loaded from the cache" if stats["cached"] else
             f"{stats['steps']} steps, loss {stats['initial_loss']:.3f} → {stats['final_loss']:.3f}, "
             f"{stats['seconds']:.0f} s")
    return stats


class Trainer:
    """One policy's training loop over the collaborators it is handed (build_trainer makes them from a config).

    Tests may hand it their own task, sharing mode, inbox or metrics sink. The rollout engine is made
    from `model`, and so is the frozen KL reference when beta > 0 and none is handed in; `closing` is
    closed with the trainer. `ranks`: this process's place under torchrun (the default: a single process);
    `metrics` is None on every rank but 0.
    """

    def __init__(self, config: TrainerConfig, *, model, tokenizer, task, optimizer, sharing: SharingMode,
                 metrics: MetricsSink | None, state: TrainState | None = None, resumed_from=None, reference=None,
                 exchange=None,
                 inbox: PeerInbox | None = None, retokenize: Retokenizer | None = None, scheduler=None,
                 closing: contextlib.ExitStack | None = None, ranks: Ranks = Ranks()):
        self.cfg = config
        self.model, self.tokenizer, self.task = model, tokenizer, task
        # the parameters the optimizer steps on, taken now: once FSDP has run a forward, model.parameters() names
        # its root's gathered (unsharded) copies, which receive no gradient
        self.params = list(model.parameters())
        self.device = self.params[0].device
        dtype = forward_dtype(config.model, self.device)      # mixed precision: float32 weights, bf16 forwards
        self.autocast = ((lambda: torch.autocast(self.device.type, dtype=dtype)) if dtype is not None
                         else contextlib.nullcontext)
        if reference is None and config.loss.beta > 0:     # the KL anchor: the model as handed in
            reference = copy.deepcopy(model).eval().requires_grad_(False)
        self.reference = reference
        self.ranks = ranks
        self._lease_size = lease_size(config, ranks)
        try:
            self.engine = make_engine(config.rollout.engine, model, tokenizer, config.rollout.max_batch,
                                      synced=ranks.sharded)
        except ValueError as exc:
            raise TrainerError(str(exc)) from exc
        self.state = state or TrainState()
        self.metrics = metrics

        def logprobs(policy):
            def forward(prompts, completions):
                with self.autocast():
                    return completion_logprobs(policy, prompts, completions, self.tokenizer.pad_token_id,
                                               self.cfg.rollout.temperature)
            return forward
        self.learner = Learner(sharing, logprobs(model), self.params, optimizer, config.loss, self.state,
                               reward=lambda problem, text: self._verify(problem, text)[0],
                               max_tokens=config.rollout.max_new_tokens,
                               reference=None if reference is None else logprobs(reference), ranks=ranks)
        self.exchange, self.inbox, self.retokenize, self.scheduler = exchange, inbox, retokenize, scheduler
        self._closing = closing or contextlib.ExitStack()
        self.resumed_from = resumed_from
        self._should_stop = lambda: False     # run()'s, so that a stop cuts the wait for peers short
        self._saved_step = self.state.step if resumed_from else None
        self._unpublished_steps = 0           # consecutive steps the exchange took nothing of (_count_unpublished)
        # prompts own samples solved (peer guidance prefers others) and the sharing mode's state, as checkpointed
        self._solved: collections.OrderedDict[str, None] = collections.OrderedDict.fromkeys(self.state.solved)
        self.sharing.restore(self.state.sharing)

    @contextlib.contextmanager
    def _lease(self, phase: str):
        """Hold a scheduler lease for one phase (rollout / update); nothing when no scheduler is configured.

        A scheduler that cannot be reached or refuses, or a lease lost mid-phase, stops the run
        (TrainerError): running without the lease could overcommit a shared device. Under torchrun rank 0
        holds one gang lease of N devices (N the number of ranks) for all of them, and no rank starts the phase
        before it is granted. With scheduler.device_ids the lease is exactly those devices (rank r's is the r-th).
        """
        s = self.cfg.scheduler
        if s is None:
            yield
            return
        held, refused = contextlib.ExitStack(), None
        if self.ranks.main:
            try:
                held.enter_context(self.scheduler.lease(devices=self._lease_size, phase=phase, ttl_s=s.ttl_s,
                                                        step_cost=s.step_cost, device_ids=s.device_ids or ()))
            except MrlError as exc:
                refused = str(exc)
        refused = self.ranks.broadcast(refused)
        if refused:
            raise TrainerError(f"no lease for {phase} from the scheduler at {s.target}: {refused}")
        try:
            with held:
                yield
        except MrlError as exc:
            raise TrainerError(f"no lease for {phase} from the scheduler at {s.target}: {exc}") from exc

    @property
    def sharing(self) -> SharingMode:
        return self.learner.sharing

    @sharing.setter
    def sharing(self, mode: SharingMode) -> None:
        self.learner.sharing = mode

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        return self.learner.optimizer

    @optimizer.setter
    def optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        self.learner.optimizer = optimizer

    # --- one step -------------------------------------------------------------------------------
    def _sampling(self, step: int, salt: int) -> SamplingParams:
        """The rollout's sampling settings at `step`, seeded by the run's seed, the step and `salt` (a rank, or
        another use of the same step's samples)."""
        r = self.cfg.rollout
        return SamplingParams(max_new_tokens=r.max_new_tokens, temperature=r.temperature, top_p=r.top_p,
                              seed=self.cfg.seed * 1_000_003 + step + salt)

    def _prompt(self, problem: Problem) -> list[int]:
        return prompt_ids(self.tokenizer, problem.question, self.cfg.system_prompt)

    def _verify(self, problem: Problem, text: str) -> tuple[float, str | None]:
        try:
            reward = float(self.task.reward(problem, text))
            answer = self.task.extract(problem, text)
        except Exception as exc:   # a verifier that raises is a broken task, not a wrong answer
            raise TrainerError(f"the verifier of task {self.task.name!r} raised on prompt {problem.prompt_id}: "
                               f"{type(exc).__name__}: {exc}") from exc
        if not (0.0 <= reward <= 1.0):
            raise TrainerError(f"the verifier of task {self.task.name!r} returned {reward} for prompt "
                               f"{problem.prompt_id}; rewards must lie in [0, 1]")
        return reward, answer

    def problems(self, step: int) -> tuple[list[Problem], int]:
        """The prompts of step `step` and how many of them the peers chose. lockstep (or no peers): the task's
        step-th batch, the same for every policy. async: first up to ⌊guided_share·τ·P⌋ prompts the peers have
        published (PeerIndex.offered: their successes this policy has not solved first), then the task's
        step-th batch for the rest. A peer's prompt id is only a key into this policy's own task (Task.find):
        the question and the answer are always its own. async: the batch's peer experience is held from here to
        the step's collect (PeerIndex.hold)."""
        size, sharing = self.cfg.rollout.prompts_per_step, self.cfg.sharing
        own = self.task.batch(step, size)
        if self.inbox is None or sharing.coupling == "lockstep":
            return own, 0
        problems, guided = guided_batch(self.inbox.offered(self._solved.keys()), self.task.find, own, size,
                                        self.sharing.guided_share())
        self.inbox.hold([p.prompt_id for p in problems])
        return problems, guided

    def rollout(self, step: int, problems: list[Problem] | None = None) -> StepBatch:
        """Sample and verify G responses to each problem (default: the task's step-th batch). Under torchrun
        each rank samples its block of the problems (with a seed of its own) and every rank gets the whole
        batch."""
        r = self.cfg.rollout
        problems = problems or self.task.batch(step, r.prompts_per_step)
        params = self._sampling(step, self.ranks.rank << 40)
        mine, real = self.ranks.block(problems)
        try:
            with self.autocast():
                samples = self.engine.generate([self._prompt(p) for p in mine], r.group_size, params)[:real]
        except RuntimeError as exc:   # e.g. sampling from NaN logits, or out of memory
            raise TrainerError(f"rollout failed at step {step}: {exc}") from exc
        verified = [[self._verify(p, s.text) for s in group] for p, group in zip(mine, samples)]
        samples, verified = zip(*self.ranks.gather(list(zip(samples, verified)))) if problems else ((), ())
        return StepBatch(step=step, problems=problems, samples=list(samples),
                         rewards=[[v[0] for v in group] for group in verified],
                         answers=[[v[1] for v in group] for group in verified])

    def update(self, batch: StepBatch, plan: Plan | None = None) -> dict[str, float]:
        """μ optimizer updates on the batch (own samples, and the plan's extra sequences); loss statistics.
        The update itself is update.update, over this policy's log-probs (and its frozen reference's)."""
        stats = self.learner.learn(batch, plan or self.learner.plan(batch, PeerBatch()))
        if "skipped" not in stats:
            self.engine.sync_weights(self.model)
        return stats

    def evaluate(self) -> dict[str, int]:
        """Greedy decoding on the held-out (eval split) problems: {prompt_id: 1 if verified correct else 0}."""
        problems, real = self.ranks.block(self.task.batch(0, self.cfg.eval.problems, split="eval"))
        params = SamplingParams(max_new_tokens=self.cfg.rollout.max_new_tokens, temperature=0.0)
        with self.autocast():
            samples = self.engine.generate([self._prompt(p) for p in problems], 1, params)[:real]
        return dict(self.ranks.gather([(p.prompt_id, int(self._verify(p, s[0].text)[0] >= 1.0))
                                       for p, s in zip(problems, samples)]))

    def step(self) -> dict:
        t = self.state.step
        step_start = start = time.perf_counter()
        cpu_start = time.process_time()
        problems, guided = self.ranks.broadcast(self.problems(t) if self.ranks.main else None)
        with self._lease("rollout"):
            batch = self.rollout(t, problems)
        rollout_s = time.perf_counter() - start
        self._note_solved(batch)
        self.learner.note(batch)
        flat_rewards = [r for group in batch.rewards for r in group]
        n_samples = len(flat_rewards)
        tokens = sum(len(s.ids) for group in batch.samples for s in group)
        published, plan, peer_stats = self.ranks.broadcast(
            self._exchange(batch, guided, n_samples, tokens, rollout_s) if self.ranks.main else None)
        start = time.perf_counter()
        with self._lease("update"):
            stats = self.update(batch, plan)
        update_s = time.perf_counter() - start
        self.state.step = t + 1
        record = {"reward_mean": self.state.batch_rewards[-1],
                  "accuracy": sum(r >= 1.0 for r in flat_rewards) / n_samples,
                  "capability": self.learner.capability(), "sharing": self.sharing.name,
                  "rollouts_total": self.state.rollouts_total, "tokens": tokens,
                  "truncated": sum(s.truncated for g in batch.samples for s in g) / n_samples,
                  "rollout_s": rollout_s, "update_s": update_s, "step_s": time.perf_counter() - step_start,
                  "cpu_s": time.process_time() - cpu_start,
                  "tokens_per_s": tokens / rollout_s,
                  "published": published, **peer_stats, **stats}
        if self.metrics is not None:
            self.metrics.log(t, **record)
        return record

    def _exchange(self, batch: StepBatch, guided: int, n_samples: int, tokens: int, rollout_s: float):
        """Publish the step's experience (with an exchange), take the peers' (with an inbox) and plan the update:
        (experiences the exchange took, the plan, the peer statistics)."""
        t, window = batch.step, self.cfg.sharing.window
        published, peer_stats, peers = 0, {}, PeerBatch()
        if self.exchange is not None:
            published = self.publish(step_experiences(
                batch, run_id=self.cfg.run_id, policy=self.cfg.policy, version=t,
                tokenizer_id=self.cfg.exchange.tokenizer_id, batch_rewards=self.state.batch_rewards,
                window=window, rollouts_per_s=n_samples / rollout_s, tokens_per_s=tokens / rollout_s,
                rollouts_total=self.state.rollouts_total))
            peer_stats["unpublished_steps"] = self._count_unpublished(t)
        if self.inbox is not None:
            prompt_ids = [p.prompt_id for p in batch.problems]
            recalled = self.recall(batch)
            wait_s = self.cfg.sharing.peer_wait_s if self.cfg.sharing.coupling == "lockstep" else 0.0
            arrived = self.inbox.collect(t, prompt_ids, wait_s, stop=self._should_stop)
            peers, peer_stats = to_peer_batch(arrived, prompt_ids, self.retokenize)
            peers, rationalized = self.rationalize(batch, peers)
            peer_stats.update(peer_guided=guided, peer_recalled=recalled, **rationalized)
        return published, self.learner.plan(batch, peers), peer_stats

    def rationalize(self, batch: StepBatch, peers: PeerBatch) -> tuple[PeerBatch, dict[str, int]]:
        """SGT with sharing.sgt.rationalize = n: the rescuable prompts' peer successes replaced by this policy's
        own verified responses, sampled (n per prompt, inside a rollout lease) with the peer's answer as a hint
        (mrl_trainer.rationalize). Otherwise the peers as they came."""
        n = self.sharing.rationalizes()
        if not n:
            return peers, {}
        params = self._sampling(batch.step, 1 << 50)

        def sample(asked, n):
            with self._lease("rollout"), self.autocast():
                return self.engine.generate([prompt_ids(self.tokenizer, question, self.cfg.system_prompt)
                                             for _, question in asked], n, params)
        return rationalize(batch, peers, self.sharing.rescuable(batch), verify=self._verify, sample=sample, n=n)

    def recall(self, batch: StepBatch) -> int:
        """async, modes that take successes: fetch the peers' verified successes on the prompts this batch failed
        entirely from the exchange's success library (GetSuccesses) into the inbox; returns how many came. A
        library that cannot answer (an older exchange, the library turned off) costs the step its recall, never the
        run; an unreachable exchange also costs the client's retry budget, as publishing does."""
        if self.cfg.sharing.coupling != "async" or "success" not in self.sharing.kinds:
            return 0
        failed = [p.prompt_id for p, rewards in zip(batch.problems, batch.rewards) if max(rewards) < 1.0]
        if not failed:
            return 0
        try:
            successes = self.exchange.get_successes(self.cfg.run_id, self.cfg.policy, failed,
                                                    producers=self.cfg.sharing.peers)
        except MrlError as exc:
            log.warning("step %d: no successes from the exchange's library: %s", batch.step, exc)
            return 0
        self.inbox.recall(successes)
        return len(successes)

    def _note_solved(self, batch: StepBatch, keep: int = 65536) -> None:
        """Remember the prompts own samples solved (the most recent `keep`), so peer guidance prefers others."""
        for problem, rewards in zip(batch.problems, batch.rewards):
            if max(rewards) >= 1.0:
                self._solved[problem.prompt_id] = None
                self._solved.move_to_end(problem.prompt_id)
        while len(self._solved) > keep:
            self._solved.popitem(last=False)

    def publish(self, experiences) -> int:
        """Publish a step's experience through the outbox (outbox.py, under checkpoint.dir), with whatever
        earlier steps or runs left there; returns how many experiences the exchange took now. With no
        experiences, sends only what the outbox holds.

        An unreachable exchange (after the client's retry budget) does not stop training, as a dead peer
        must not block a policy, nor loses anything: the experience waits in the outbox for a later step
        or the next run. A refusal (bad token, wrong policy, invalid experience) is a configuration error
        and stops the run.
        """
        outbox = Outbox(self.cfg.checkpoint.dir)
        try:
            for exp in experiences:
                validate(exp)  # before it is kept: an experience no exchange takes must not block the outbox
            if experiences:
                outbox.put(experiences)
            return outbox.send(self.exchange.publish)
        except MrlError as exc:
            raise TrainerError(f"the exchange refused this trainer's experience: {exc} (what it has not taken "
                               f"waits in {outbox.folder})") from exc

    def _count_unpublished(self, t: int) -> int:
        """Consecutive steps, up to t, that left experience in the outbox: each logs a warning, and at
        exchange.max_unpublished_steps (0: never) the run stops rather than train solo unseen."""
        waiting = Outbox(self.cfg.checkpoint.dir).pending()
        self._unpublished_steps = self._unpublished_steps + 1 if waiting else 0
        limit = self.cfg.exchange.max_unpublished_steps
        if waiting:
            log.warning("step %d: the exchange at %s has taken nothing for %d step(s) in a row; %d experiences wait "
                        "in the outbox (the run stops at %s)", t, self.cfg.exchange.target, self._unpublished_steps,
                        waiting, limit or "no limit: exchange.max_unpublished_steps is 0")
        if limit and self._unpublished_steps >= limit:
            raise TrainerError(f"the exchange at {self.cfg.exchange.target} took nothing for {limit} steps in a row "
                               f"(exchange.max_unpublished_steps): stopping rather than training solo; the steps' "
                               f"experience waits in {Outbox(self.cfg.checkpoint.dir).folder} for the next run")
        return self._unpublished_steps

    # --- the run --------------------------------------------------------------------------------
    def checkpoint(self) -> None:
        """Save the state at the current step, unless that step is saved already."""
        if self._saved_step == self.state.step:
            return
        self.state.solved, self.state.sharing = list(self._solved), self.sharing.state()
        save_checkpoint(self.cfg.checkpoint.dir, self.model, self.tokenizer, self.optimizer, self.state,
                        keep=self.cfg.checkpoint.keep, ranks=self.ranks)
        self._saved_step = self.state.step

    def log_eval(self) -> float:
        """Log held-out accuracy with each problem's outcome (paired comparisons resample them); return it."""
        correct = self.evaluate()
        accuracy = sum(correct.values()) / len(correct)
        if self.metrics is not None:
            self.metrics.log(self.state.step, kind="eval", eval_accuracy=accuracy,
                             eval_prompt_ids=list(correct), eval_correct=list(correct.values()),
                             rollouts_total=self.state.rollouts_total)
        return accuracy

    def _eval_progress(self, bar) -> None:
        accuracy = self.log_eval()
        bar.set_postfix(eval_acc=f"{accuracy:.3f}")
        if bar.disable and self.ranks.main:
            log.info("step %d: held-out accuracy %.3f", self.state.step, accuracy)

    def run(self, should_stop=lambda: False) -> TrainState:
        """Train until `steps` (or until should_stop() turns true), checkpointing on the way and at the end."""
        from tqdm import tqdm
        cfg = self.cfg
        self._should_stop = should_stop
        every = cfg.eval.every
        bar = tqdm(total=cfg.steps, initial=self.state.step, desc=cfg.policy,
                   disable=not (cfg.metrics.progress and self.ranks.main))
        stopped = lambda: self.ranks.broadcast(should_stop())     # noqa: E731  rank 0's word holds for all
        try:
            if every and self.state.step == 0:
                self._eval_progress(bar)
            while self.state.step < cfg.steps and not stopped():
                record = self.step()
                bar.update(1)
                bar.set_postfix(reward=f"{record['reward_mean']:.3f}", loss=f"{record.get('loss', 0.0):.4f}")
                if bar.disable and self.ranks.main:
                    log.info("%s", _step_line(self.state.step, cfg.steps, record))
                done = self.state.step >= cfg.steps
                if every and (self.state.step % every == 0 or done):
                    self._eval_progress(bar)
                if self.state.step % cfg.checkpoint.every == 0 or done:
                    self.checkpoint()
            if self.state.step < cfg.steps:      # stopped early: keep what was done
                self.checkpoint()
        finally:
            bar.close()
        return self.state

    def close(self) -> None:
        self._closing.close()
        getattr(self.engine, "close", lambda: None)()    # SGLang's subprocesses; HF has nothing to free
