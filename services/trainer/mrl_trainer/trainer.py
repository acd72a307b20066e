"""The training loop of one policy: rollout → reward → publish → peers → update → checkpoint.

    step t:  problems   = task.batch(t, P)                       same prompts for every policy at step t
             y_1..y_G   ~ π_old(· | x)                           engine.generate, behaviour log-probs kept
             R_i        = verifier(x, y_i) ∈ [0, 1]
             publish    rollouts, group_stats, successes, policy_stats (when an exchange is configured)
             peers      what the peers published for these prompt ids, waited for at most peer_wait_s,
                        retokenized by THL (sharing modes other than none; peers.py)
             plan       the sharing mode's advantages and extra sequences (sharing/): none is
                        A_i = (R_i − mean R) / (std R + ε)       (Dr.GRPO: no std)
             θ ← θ − lr ∇ L(θ)                                   L = the mode's own loss (GRPO / GSPO, DAPO
                                                                 clip-higher, k3 KL when beta > 0) + its extra terms
             checkpoint every `checkpoint.every` steps

Rollout and update each run inside a scheduler lease when `scheduler` is configured (MWRA).

The batch is split into micro-batches of at most `loss.micro_batch_tokens` padded tokens; each
micro-batch loss is normalised by the whole batch's totals, so the accumulated gradient equals the
full-batch gradient. With μ = updates_per_step = 1, π_old is π_θ detached (no extra forward).
"""
import contextlib
import copy
import hashlib
import logging
import os
import random
import time

import numpy as np
import torch

from mrl.errors import MrlError, Unavailable
from mrl_trainer.checkpoint import TrainState, latest_checkpoint, load_checkpoint, save_checkpoint
from mrl_trainer.config import TrainerConfig
from mrl_trainer.errors import TrainerError
from mrl_trainer.experience import StepBatch, capability, step_experiences
from mrl_trainer.logprobs import completion_logprobs
from mrl_trainer.metrics import MetricsSink
from mrl_trainer.peers import PeerInbox, Retokenizer, to_peer_batch
from mrl_trainer.policy import load_policy, prompt_ids
from mrl_trainer.rollout import SamplingParams, make_engine
from mrl_trainer.sft import warm_start
from mrl_trainer.sharing import PeerBatch, Plan, Verifier, make_sharing
from mrl_trainer.tasks import Problem, make_task

__all__ = ["Trainer", "micro_batches"]

log = logging.getLogger("mrl.trainer")


def micro_batches(lengths: list[int], budget: int) -> list[list[int]]:
    """Consecutive index groups whose padded size (count × longest) stays within `budget` tokens."""
    groups, current, longest = [], [], 0
    for i, n in enumerate(lengths):
        if current and (len(current) + 1) * max(longest, n) > budget:
            groups.append(current)
            current, longest = [], 0
        current.append(i)
        longest = max(longest, n)
    return groups + ([current] if current else [])


def _step_line(step: int, steps: int, record: dict) -> str:
    """One log line per step (when the progress bar is off): reward, time, and the sharing mode's counts."""
    shown = {"peer_samples": "peer samples", "sgt_rescued": "rescued", "sgt_rejected": "rejected",
             "thl_one_to_one": "THL 1:1", "peers_complete": "peers complete"}
    extra = "".join(f", {label} {record[k]:.3g}" for k, label in shown.items() if k in record)
    return (f"step {step}/{steps}: reward {record['reward_mean']:.3f}, rollout {record['rollout_s']:.1f} s, "
            f"update {record['update_s']:.1f} s{extra}")


class Trainer:
    def __init__(self, config: TrainerConfig, exchange=None):
        """`exchange`: an mrl.exchange_client.ExchangeClient to publish to (None: solo)."""
        self.cfg = config
        self.device = torch.device("cuda" if config.device == "auto" and torch.cuda.is_available()
                                   else "cpu" if config.device == "auto" else config.device)
        random.seed(config.seed)
        np.random.seed(config.seed)
        self.model, self.tokenizer = load_policy(config.model, self.device, seed=config.seed)
        self.task = make_task(config.task)
        found = latest_checkpoint(config.checkpoint.dir) if config.checkpoint.resume else None
        if config.warm_start and not found:
            key = hashlib.blake2b(f"{config.model.model_dump_json()}|{config.task.model_dump_json()}".encode(),
                                  digest_size=8).hexdigest()
            stats = warm_start(self.model, self.tokenizer, self.task, config.warm_start,
                               system_prompt=config.system_prompt, seed=config.seed, cache_key=key, device=self.device)
            log.info("warm start: %s", "loaded from the cache" if stats["cached"] else
                     f"{stats['steps']} steps, loss {stats['initial_loss']:.3f} → {stats['final_loss']:.3f}, "
                     f"{stats['seconds']:.0f} s")
        self.reference = (copy.deepcopy(self.model).eval().requires_grad_(False) if config.loss.beta > 0 else None)
        self.engine = make_engine(config.rollout.engine, self.model, self.tokenizer, config.rollout.max_batch)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=config.loss.lr,
                                           weight_decay=config.loss.weight_decay)
        self.state = TrainState()
        if found:
            self.state = load_checkpoint(found, self.model, self.optimizer)
            self.engine.sync_weights(self.model)
        self.exchange = exchange
        self.sharing = make_sharing(config.sharing, config.loss)
        self._closing = contextlib.ExitStack()
        self.inbox = self.retokenize = self.scheduler = None
        if self.sharing.kinds:
            if exchange is None:
                raise TrainerError(f"sharing mode {self.sharing.name!r} takes peers' experience: pass an exchange client")
            self.inbox = self._closing.enter_context(contextlib.closing(PeerInbox(
                exchange, config.run_id, config.policy, self.sharing.kinds, config.sharing.peers,
                config.sharing.max_staleness)))
            self.retokenize = Retokenizer(config.exchange.tokenizer_id, self._align_client())
        if config.scheduler:
            from mrl.scheduler_client import SchedulerClient
            self.scheduler = self._closing.enter_context(SchedulerClient(
                config.scheduler.target, config.scheduler.token or os.environ.get("MRL_TOKEN"),
                run_id=config.run_id, policy=config.policy))
        self.metrics = MetricsSink(config.policy, config.metrics.jsonl or f"{config.checkpoint.dir}/metrics.jsonl",
                                   config.metrics.prometheus_port, config.metrics.tensorboard)
        self.resumed_from = found
        self._should_stop = lambda: False     # run()'s, so that a stop cuts the wait for peers short
        self._saved_step = self.state.step if found else None

    def _align_client(self):
        align = self.cfg.sharing.align
        if align is None:
            return None
        from mrl.align_client import AlignClient
        token = align.token or self.cfg.exchange.token or os.environ.get("MRL_TOKEN")
        return self._closing.enter_context(AlignClient(align.target, token))

    @contextlib.contextmanager
    def _lease(self, phase: str):
        """Hold a scheduler lease for one phase (rollout / update); nothing when no scheduler is configured.

        A scheduler that cannot be reached or refuses, or a lease lost mid-phase, stops the run
        (TrainerError): running without the lease could overcommit a shared device.
        """
        if self.scheduler is None:
            yield
            return
        s = self.cfg.scheduler
        try:
            with self.scheduler.lease(devices=s.devices, phase=phase, ttl_s=s.ttl_s, step_cost=s.step_cost):
                yield
        except MrlError as exc:
            raise TrainerError(f"no lease for {phase} from the scheduler at {s.target}: {exc}") from exc

    def _capability(self) -> float:
        return capability(self.state.batch_rewards, self.cfg.sharing.hacpo.window)

    def _verifier(self, batch: StepBatch) -> Verifier:
        return Verifier(batch, lambda problem, text: self._verify(problem, text)[0])

    # --- one step -------------------------------------------------------------------------------
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

    def rollout(self, step: int) -> StepBatch:
        r = self.cfg.rollout
        problems = self.task.batch(step, r.prompts_per_step)
        params = SamplingParams(max_new_tokens=r.max_new_tokens, temperature=r.temperature, top_p=r.top_p,
                                seed=self.cfg.seed * 1_000_003 + step)
        try:
            samples = self.engine.generate([self._prompt(p) for p in problems], r.group_size, params)
        except RuntimeError as exc:   # e.g. sampling from NaN logits, or out of memory
            raise TrainerError(f"rollout failed at step {step}: {exc}") from exc
        verified = [[self._verify(p, s.text) for s in group] for p, group in zip(problems, samples)]
        return StepBatch(step=step, problems=problems, samples=samples,
                         rewards=[[v[0] for v in group] for group in verified],
                         answers=[[v[1] for v in group] for group in verified])

    def update(self, batch: StepBatch, plan: Plan | None = None) -> dict[str, float]:
        """μ optimizer updates on the batch (own samples, and the plan's extra sequences); loss statistics."""
        loss_cfg, pad = self.cfg.loss, self.tokenizer.pad_token_id
        plan = plan or self.sharing.plan(batch, PeerBatch(), capability=self._capability(), verify=self._verifier(batch))
        flat = [s for group in batch.samples for s in group]
        own_prompts = [group[0].prompt_ids for group in batch.samples]
        # With beta = 0 a sample whose advantage is 0 adds exactly 0 to the loss and its gradient (the
        # plan's totals stay whole), so only the others are forwarded: same update, less compute.
        active = [i for i, s in enumerate(flat) if s.ids and (loss_cfg.beta > 0 or plan.advantages[i] != 0)]
        extras = [e for e in plan.extras if e.ids]
        if not active and not extras:
            return {"skipped": 1.0, "extras": 0, **plan.stats}
        advantages = plan.advantages[active]
        own = ([flat[i].prompt_ids for i in active], [flat[i].ids for i in active])
        peer = ([own_prompts[e.prompt_index] for e in extras], [e.ids for e in extras])
        budget, temperature, max_tokens = loss_cfg.micro_batch_tokens, self.cfg.rollout.temperature, \
            self.cfg.rollout.max_new_tokens
        own_groups = micro_batches([len(p) + len(c) for p, c in zip(*own)], budget)
        extra_groups = micro_batches([len(p) + len(c) for p, c in zip(*peer)], budget)
        old = None
        if loss_cfg.updates_per_step > 1:
            with torch.no_grad():
                old = [completion_logprobs(self.model, [own[0][i] for i in g], [own[1][i] for i in g], pad,
                                           temperature)[0] for g in own_groups]
        for m in range(loss_cfg.updates_per_step):     # the statistics reported are the last update's
            loss_total, sums, per_sequence = 0.0, {}, {}
            for k, g in enumerate(own_groups):
                mb_prompts, mb_completions = [own[0][i] for i in g], [own[1][i] for i in g]
                logp, mask = completion_logprobs(self.model, mb_prompts, mb_completions, pad, temperature)
                ref = None
                if self.reference is not None:
                    with torch.no_grad():
                        ref = completion_logprobs(self.reference, mb_prompts, mb_completions, pad, temperature)[0]
                loss, stats = self.sharing.own_loss(logp, logp.detach() if old is None else old[k],
                                                    advantages[g].to(logp.device), mask, ref_logp=ref,
                                                    max_tokens=max_tokens, totals=plan.totals)
                loss_total += self._backward(loss, batch.step)
                for name, value in stats.items():
                    sums[name] = sums.get(name, 0.0) + value * len(g) / len(active)
            for g in extra_groups:
                logp, mask = completion_logprobs(self.model, [peer[0][i] for i in g], [peer[1][i] for i in g], pad,
                                                 temperature)
                loss, stats = self.sharing.extra_loss(logp, mask, [extras[i] for i in g], update=m,
                                                      max_tokens=max_tokens, totals=plan.extra_totals)
                loss_total += self._backward(loss, batch.step)
                for name, values in stats.items():
                    per_sequence.setdefault(name, []).append(values.detach().cpu())
            grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), loss_cfg.max_grad_norm)
            if not torch.isfinite(grad_norm):
                self.optimizer.zero_grad(set_to_none=True)
                raise TrainerError(f"non-finite gradient norm at step {batch.step}: no update was applied")
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        self.engine.sync_weights(self.model)
        if per_sequence:
            sums.update(self.sharing.summarize({k: torch.cat(v) for k, v in per_sequence.items()}))
        return {"loss": loss_total, "grad_norm": float(grad_norm), "active": len(active) / len(flat),
                "extras": len(extras), **plan.stats, **sums}

    def _backward(self, loss: torch.Tensor, step: int) -> float:
        if not torch.isfinite(loss):
            self.optimizer.zero_grad(set_to_none=True)
            raise TrainerError(f"non-finite loss ({loss.item()}) at step {step}: no update was "
                               f"applied; lower loss.lr or check the rewards and the model's dtype")
        loss.backward()
        return loss.item()

    def evaluate(self) -> float:
        """Greedy accuracy on the held-out (eval split) problems."""
        problems = self.task.batch(0, self.cfg.eval.problems, split="eval")
        params = SamplingParams(max_new_tokens=self.cfg.rollout.max_new_tokens, temperature=0.0)
        samples = self.engine.generate([self._prompt(p) for p in problems], 1, params)
        return sum(self._verify(p, s[0].text)[0] >= 1.0 for p, s in zip(problems, samples)) / len(problems)

    def step(self) -> dict:
        t = self.state.step
        start = time.perf_counter()
        with self._lease("rollout"):
            batch = self.rollout(t)
        rollout_s = time.perf_counter() - start
        flat_rewards = [r for group in batch.rewards for r in group]
        n_samples = len(flat_rewards)
        tokens = sum(len(s.ids) for group in batch.samples for s in group)
        self.state.rollouts_total += n_samples
        window = self.cfg.sharing.hacpo.window
        self.state.batch_rewards = (self.state.batch_rewards + [sum(flat_rewards) / n_samples])[-window:]
        published = 0
        if self.exchange is not None:
            published = self.publish(step_experiences(
                batch, run_id=self.cfg.run_id, policy=self.cfg.policy, version=t,
                tokenizer_id=self.cfg.exchange.tokenizer_id, batch_rewards=self.state.batch_rewards,
                window=window, rollouts_per_s=n_samples / rollout_s, tokens_per_s=tokens / rollout_s,
                rollouts_total=self.state.rollouts_total))
        peer_stats, peers = {}, PeerBatch()
        if self.inbox is not None:
            prompt_ids = [p.prompt_id for p in batch.problems]
            arrived = self.inbox.collect(t, prompt_ids, self.cfg.sharing.peer_wait_s, stop=self._should_stop)
            peers, peer_stats = to_peer_batch(arrived, prompt_ids, self.retokenize)
        plan = self.sharing.plan(batch, peers, capability=self._capability(), verify=self._verifier(batch))
        start = time.perf_counter()
        with self._lease("update"):
            stats = self.update(batch, plan)
        update_s = time.perf_counter() - start
        self.state.step = t + 1
        record = {"reward_mean": self.state.batch_rewards[-1],
                  "accuracy": sum(r >= 1.0 for r in flat_rewards) / n_samples,
                  "capability": self._capability(), "sharing": self.sharing.name,
                  "rollouts_total": self.state.rollouts_total, "tokens": tokens,
                  "truncated": sum(s.truncated for g in batch.samples for s in g) / n_samples,
                  "rollout_s": rollout_s, "update_s": update_s, "tokens_per_s": tokens / rollout_s,
                  "published": published, **peer_stats, **stats}
        self.metrics.log(t, **record)
        return record

    def publish(self, experiences) -> int:
        """Publish a step's experience; returns how many were sent (0 while the exchange is unreachable).

        An unreachable exchange (after the client's retries) does not stop training: the step's
        experience is skipped with a warning, as a dead peer must not block a policy. A refusal
        (bad token, wrong policy, invalid experience) is a configuration error and stops the run.
        """
        try:
            self.exchange.publish(experiences)
        except Unavailable as exc:
            log.warning("exchange unreachable, step's experience not published: %s", exc)
            return 0
        except MrlError as exc:
            raise TrainerError(f"the exchange refused this trainer's experience: {exc}") from exc
        return len(experiences)

    # --- the run --------------------------------------------------------------------------------
    def checkpoint(self) -> None:
        """Save the state at the current step, unless that step is saved already."""
        if self._saved_step == self.state.step:
            return
        save_checkpoint(self.cfg.checkpoint.dir, self.model, self.tokenizer, self.optimizer, self.state,
                        keep=self.cfg.checkpoint.keep)
        self._saved_step = self.state.step

    def log_eval(self) -> float:
        accuracy = self.evaluate()
        self.metrics.log(self.state.step, kind="eval", eval_accuracy=accuracy,
                         rollouts_total=self.state.rollouts_total)
        return accuracy

    def _eval_progress(self, bar) -> None:
        accuracy = self.log_eval()
        bar.set_postfix(eval_acc=f"{accuracy:.3f}")
        if bar.disable:
            log.info("step %d: held-out accuracy %.3f", self.state.step, accuracy)

    def run(self, should_stop=lambda: False) -> TrainState:
        """Train until `steps` (or until should_stop() turns true), checkpointing on the way and at the end."""
        from tqdm import tqdm
        cfg = self.cfg
        self._should_stop = should_stop
        every = cfg.eval.every
        bar = tqdm(total=cfg.steps, initial=self.state.step, desc=cfg.policy, disable=not cfg.metrics.progress)
        try:
            if every and self.state.step == 0:
                self._eval_progress(bar)
            while self.state.step < cfg.steps and not should_stop():
                record = self.step()
                bar.update(1)
                bar.set_postfix(reward=f"{record['reward_mean']:.3f}", loss=f"{record.get('loss', 0.0):.4f}")
                if bar.disable:
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
        self.metrics.close()
        getattr(self.engine, "close", lambda: None)()    # SGLang's subprocesses; HF has nothing to free
