"""TRL's GRPOTrainer joins a mutual run: `MutualGRPOTrainer` (pip install ./sdk[trl], TRL 1.16.0).

    from mrl import AlignClient, ExchangeClient
    from mrl.integrations.trl import Mutual, MutualGRPOTrainer

    trainer = MutualGRPOTrainer(model=model, reward_funcs=correct, args=grpo_config, train_dataset=dataset,
                                processing_class=tokenizer,
                                mutual=Mutual(exchange=ExchangeClient(target, token), run_id="run-1",
                                              policy="trl-gpt2", tokenizer_id="gpt2", sharing="sgt",
                                              peers=["llama-tiny"], align=AlignClient(thl_target, token)))
    trainer.train()
    trainer.close()

A subclass of TRL 1.16's GRPOTrainer; its loss is TRL's, untouched. Each generation batch (one step t of the
run: its P prompts × G completions) goes through `_generate_and_score_completions` as in TRL, then:

    publish   rollouts (text, token ids, behaviour log-probs, reward, verdict), group_stats, verified
              successes (reward ≥ success_reward) and policy_stats, under `policy` at version t
              (mrl.experience.step_experiences: the same kinds and fields as the mrl trainer's); the
              rollouts wait for their log-probs when TRL's loss forward gives them (below)
    peers     with a sharing mode: what the peers published for the same prompt ids, waited for at most
              peer_wait_s (mrl.peers.PeerInbox), their responses retokenized by THL (mrl.peers.Retokenizer)
    xgrpo     the advantages of the prompts the peers scored are replaced by the pooled ones
              (mrl.algorithms.xgrpo.pooled_advantages, as the mrl trainer's XGRPO)
    sgt       the re-verified peer successes of the failed prompts form the rescue set S; `_compute_loss` adds
              λ·NLL(S) to TRL's loss (mrl.algorithms.sgt.rescue_nll, as the mrl trainer's SGT)

Prompts are matched by the dataset's `prompt_id` column: the run's task ids (e.g. the mrl trainer's
"arithmetic-L1:train:0:17"); `task_dataset` and `task_reward` make the dataset and the verifier's reward function of
a run's task (mrl.tasks, installed with this extra). The mrl trainer takes task.batch(t, P) at step t; a TRL trainer sees the same prompts
at its step t when its dataset holds the task's train problems in order, `shuffle_dataset=False`, and P =
generation_batch_size / num_generations equals the peers' prompts per step. Step t is the t-th generation
batch of this trainer (a generation batch feeds steps_per_generation × num_iterations optimizer micro-steps).

Behaviour log-probs cost no forward pass of their own. When TRL computes old_per_token_logps (vLLM, or
generation out of step with the optimizer), the rollouts carry those and go out with the rest. Otherwise
TRL's loss uses its own forward's per-token log-probs, detached, as π_old: every row of the generation batch
goes through that forward before any optimizer step (TRL's condition for skipping old_per_token_logps). The
integration keeps those (each row found by an `mrl_row` column TRL shuffles and splits with the batch) and
publishes the rollouts when the last row of the step has passed. group_stats, successes and policy_stats go
right after scoring, before this trainer waits for its peers: what XGRPO and SGT peers wait for is never held
back; a peer that takes rollouts (the mrl trainer's PRP, HACPO) gets them after the loss forward of the step's
last micro-batch.

With no sharing (`sharing="none"`), or no peer publishing, the trainer trains exactly as GRPOTrainer: the
advantages and the loss are TRL's. A peer's claimed reward is never trusted: SGT re-verifies each success with
this trainer's own reward functions (TRL's `_calculate_rewards`, the same kwargs and weights as for its own
completions). XGRPO pools the peers' group rewards as published (it moves only baselines; docs/algorithms.md).

One process (no multi-GPU data parallelism yet), text-only prompts (plain strings or chat messages).
Statistics go to TRL's own logs under `mrl/` (mrl/published, mrl/unpublished_steps, mrl/peers_complete, mrl/xgrpo_pooled,
mrl/sgt_accepted, mrl/sgt_rejected, mrl/sgt_nll, mrl/peer_experiences_used, mrl/thl_*), and to
`MutualGRPOTrainer.mutual_log`, one dict per step.
"""
import logging
import time
from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import Tensor
from trl import GRPOTrainer
from trl.data_utils import is_conversational

from mrl.algorithms.sgt import rescue_nll
from mrl.algorithms.xgrpo import pooled_advantages
from mrl.errors import InvalidArgument, Unavailable
from mrl.experience import Group, Response, kind_of, step_experiences, validate_name
from mrl.peers import Arrived, PeerInbox, Retokenizer

__all__ = ["Mutual", "MutualGRPOTrainer", "SHARING_KINDS", "pooled_advantages", "rescue_nll", "task_dataset",
           "task_reward"]

log = logging.getLogger("mrl.integrations.trl")

# sharing mode → the experience kinds it takes from peers (the mrl trainer's modes of the same names)
SHARING_KINDS: dict[str, tuple[str, ...]] = {"none": (), "xgrpo": ("group_stats",), "sgt": ("success",)}


@dataclass
class Mutual:
    """How a TRL trainer joins a run. The knobs of xgrpo and sgt are the mrl trainer's (`sharing.xgrpo`,
    `sharing.sgt`; docs/algorithms.md) under the same names. Making one checks the connection to the exchange (and
    THL), as `policy` in `run_id`, in one round trip each (mrl.connection): make it before loading the model, so a
    wrong address, TLS setting, token or policy stops the script at once."""
    exchange: object                       # an mrl.ExchangeClient, authenticated as `policy`
    run_id: str
    policy: str                            # this trainer's policy id (its token's principal)
    tokenizer_id: str                      # THL's id of this model's tokenizer, e.g. "gpt2"
    sharing: Literal["none", "xgrpo", "sgt"] = "none"
    peers: list[str] = field(default_factory=list)   # producers to wait for (empty: any one producer)
    peer_wait_s: float = 30.0              # the longest wait for the peers' experience of a step
    max_staleness: int = 1                 # peer experience older than (t − max_staleness) versions is dropped
    align: object | None = None            # an mrl.AlignClient (THL): required for peers of another tokenizer
    success_reward: float = 1.0            # a completion whose reward reaches it is a verified success
    window: int = 5                        # capability P̂ = mean batch reward over the last `window` steps
    uniform_groups: Literal["pooled", "zero"] = "zero"        # xgrpo
    lam: float = 0.1                       # sgt: λ
    per_prompt: int = 1                    # sgt: most accepted peer successes per rescued prompt
    tau: float = 0.0                       # sgt: rescue a prompt when the own success rate ≤ τ
    normalize: Literal["responses", "prompts"] = "responses"  # sgt: the NLL's divisor N
    max_unpublished_steps: int = 10        # stop after this many consecutive steps the exchange took nothing of (0: never)

    def __post_init__(self):
        validate_name("run_id", self.run_id)
        validate_name("policy", self.policy)
        for peer in self.peers:
            validate_name("peer", peer)
        choices = {"sharing": (self.sharing, tuple(SHARING_KINDS)), "uniform_groups": (self.uniform_groups,
                   ("pooled", "zero")), "normalize": (self.normalize, ("responses", "prompts"))}
        for name, (value, valid) in choices.items():
            if value not in valid:
                raise InvalidArgument(f"{name} {value!r} is not one of {', '.join(valid)}")
        if self.policy in self.peers:
            raise InvalidArgument(f"peers {self.peers} lists this policy itself ({self.policy!r})")
        if not self.tokenizer_id:
            raise InvalidArgument("tokenizer_id is empty: give THL's id of this model's tokenizer (e.g. 'gpt2')")
        bounds = {"peer_wait_s": (self.peer_wait_s, 0), "max_staleness": (self.max_staleness, 0),
                  "window": (self.window, 1), "lam": (self.lam, 0), "per_prompt": (self.per_prompt, 1),
                  "tau": (self.tau, 0)}
        for name, (value, low) in bounds.items():
            if value < low:
                raise InvalidArgument(f"{name} is {value}; it must be >= {low}")
        if self.tau > 1:
            raise InvalidArgument(f"tau is {self.tau}; it is a success rate, in [0, 1]")
        if self.max_unpublished_steps < 0:
            raise InvalidArgument(f"max_unpublished_steps is {self.max_unpublished_steps}; it must be >= 0 (0: never "
                                  f"stop)")
        self.exchange.check(self.run_id, self.policy)        # the connection check: before any model is loaded
        if self.align is not None:
            self.align.check()


def task_dataset(task, tokenizer, n: int):
    """The run's prompts as TRL's train dataset: the first n train problems of an mrl.tasks task in order (=
    task.batch(t, P) for t = 0, 1, ..., the mrl trainer's step-t prompts), as rows `prompt` (the question as one user
    turn in the tokenizer's chat template, as the mrl trainer poses it: mrl.prompts, the same token ids once TRL
    encodes it) and `prompt_id`; a tokenizer without a chat template is given the trainer's. Train with
    shuffle_dataset=False and P = generation_batch_size / num_generations for step t to hold the peers' prompts."""
    from datasets import Dataset
    from mrl.prompts import ensure_template, prompt_text
    ensure_template(tokenizer)      # a base model's tokenizer (Gemma-3-270M) has none: the trainer's plain form
    return Dataset.from_list([{"prompt": prompt_text(tokenizer, p.question), "prompt_id": p.prompt_id}
                              for p in task.batch(0, n)])


def task_reward(task, n: int):
    """A TRL reward function for task_dataset(task, ., n): the task's verifier of each completion, by the row's
    prompt_id (1.0 iff its final answer is right); it records every (prompt_id, completion) it scores in `.calls`."""
    problems = {p.prompt_id: p for p in task.batch(0, n)}

    def correct(completions, prompt_id, **_):
        correct.calls += list(zip(prompt_id, completions))
        return [task.reward(problems[pid], _text(text)) for pid, text in zip(prompt_id, completions)]
    correct.calls = []
    return correct


@dataclass
class _Rescue:
    """The step's rescue set S as TRL's forward takes it: prompts left-padded, responses right-padded."""
    input_ids: Tensor          # (|S|, Lp + Lc)
    attention_mask: Tensor     # (|S|, Lp + Lc)
    mask: Tensor               # (|S|, Lc) response tokens
    divisor: int


@dataclass
class _Pending:
    """A step's rollouts waiting for their behaviour log-probs from TRL's loss forward (module docstring)."""
    step: int
    record: dict               # the step's mutual_log record: "published" counts them once they are sent
    rollouts: list             # pb.Experience (rollout), logprobs still empty
    rows: list[int]            # each rollout's row of the generation batch
    masks: Tensor              # (N, Lc) bool, CPU: the completion tokens
    logps: Tensor              # (N, Lc) float, CPU: filled as the rows pass through the loss
    seen: Tensor               # (N,) bool


def _text(completion) -> str:
    """A completion's text: a plain string, or the content of its last (assistant) message."""
    return completion if isinstance(completion, str) else completion[-1]["content"]


def _prompt_text(prompt) -> str:
    return prompt if isinstance(prompt, str) else prompt[-1]["content"]


def _pad(rows: list[Tensor], value: int, left: bool) -> Tensor:
    """(n, max length) of 1-d rows, padded with `value` on the left (prompts) or the right (responses)."""
    width = max(len(r) for r in rows)
    out = rows[0].new_full((len(rows), width), value)
    for i, r in enumerate(rows):
        if left:
            out[i, width - len(r):] = r
        else:
            out[i, :len(r)] = r
    return out


class MutualGRPOTrainer(GRPOTrainer):
    """TRL's GRPOTrainer that publishes its experience to a mutual run and takes its peers' (module docstring).
    All of GRPOTrainer's arguments, plus `mutual` (a Mutual)."""

    def __init__(self, *args, mutual: Mutual, **kwargs):
        if not isinstance(mutual, Mutual):
            raise InvalidArgument(f"mutual must be an mrl.integrations.trl.Mutual, not {type(mutual).__name__}")
        super().__init__(*args, **kwargs)
        self.mutual = mutual
        self._check()
        self._inbox = None
        if SHARING_KINDS[mutual.sharing]:
            self._inbox = PeerInbox(mutual.exchange, mutual.run_id, mutual.policy, SHARING_KINDS[mutual.sharing],
                                    mutual.peers, mutual.max_staleness)
        self._retokenize = Retokenizer(mutual.tokenizer_id, mutual.align,
                                       end_id=getattr(self.processing_class, "eos_token_id", None))
        self._generation = 0                           # the run's step t: generation batches so far
        self._batch_rewards: list[float] = []
        self._rollouts_total = 0
        self._unpublished = 0                          # consecutive steps the exchange took nothing of
        self._scored = None                            # (rewards_per_func, completions) of the last generation
        self._rescue: _Rescue | None = None
        self._pending: _Pending | None = None          # the rollouts of the last step, until the loss sees its rows
        self._loss_logps: list[Tensor] | None = None   # while TRL's loss forward runs: where its log-probs go
        self.mutual_log: list[dict] = []               # one record per step (also logged by TRL under mrl/)

    def _check(self) -> None:
        columns = getattr(self.train_dataset, "column_names", None) or []
        if "prompt_id" not in columns:
            raise InvalidArgument(f"the train dataset has no 'prompt_id' column (it has {columns}): give each prompt "
                                  f"the run's prompt id, which peers match experience by (docs/trl.md)")
        if self.accelerator.num_processes != 1:
            raise InvalidArgument(f"MutualGRPOTrainer runs in one process; this run has "
                                  f"{self.accelerator.num_processes} (multi-process data parallelism is not supported yet)")
        if self.mutual.sharing == "xgrpo" and (self.scale_rewards not in ("group", "none")
                                               or self.multi_objective_aggregation != "sum_then_normalize"):
            raise InvalidArgument(f"xgrpo pools group baselines: it needs scale_rewards 'group' or 'none' (got "
                                  f"{self.scale_rewards!r}) and multi_objective_aggregation 'sum_then_normalize' "
                                  f"(got {self.multi_objective_aggregation!r})")

    def close(self) -> None:
        """Stop the subscription to the peers' experience (the exchange client stays the caller's)."""
        if self._pending is not None:
            self._abandon("the trainer was closed before TRL's loss saw every row of the step")
        if self._inbox is not None:
            self._inbox.close()
            self._inbox = None

    # --- TRL's hooks ------------------------------------------------------------------------------
    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._scored = (rewards_per_func, completions)
        return rewards_per_func

    def _generate_and_score_completions(self, inputs):
        if not self.model.training:                    # evaluation: TRL's, nothing published
            return super()._generate_and_score_completions(inputs)
        if self._pending is not None:
            self._abandon("a new generation began before TRL's loss saw every row of the step")
        start = time.perf_counter()
        out = super()._generate_and_score_completions(inputs)
        generate_s = time.perf_counter() - start
        step, self._generation = self._generation, self._generation + 1
        rewards_per_func, completions = self._scored
        rewards = (rewards_per_func * self.reward_weights.to(rewards_per_func.device)).nansum(dim=1)
        rewards[torch.isnan(rewards_per_func).all(dim=1)] = torch.nan      # unscorable, as TRL marks them
        G = self.num_generations
        prompt_ids = self._prompt_ids(inputs, G)
        record = {"step": step}
        self._publish(step, inputs, out, rewards, completions, generate_s, record)
        self._rescue = None
        if self._inbox is not None:
            arrived = self._inbox.collect(step, prompt_ids, self.mutual.peer_wait_s)
            record.update(peer_wait_s=arrived.waited_s, peers_complete=arrived.complete)
            if self.mutual.sharing == "xgrpo":
                out["advantages"], stats = self._xgrpo(out["advantages"], rewards.view(-1, G), arrived, prompt_ids)
            else:
                stats = self._sgt(inputs, out, rewards.view(-1, G), arrived, prompt_ids)
            record.update(stats)
        for key, value in record.items():
            if key not in ("step", "published"):          # published: once the step's rollouts are sent
                self._metrics["train"][f"mrl/{key}"].append(float(value))
        self.mutual_log.append(record)
        return out

    def _get_per_token_logps_and_entropies(self, *args, **kwargs):
        """TRL's; while `_compute_loss` collects them (`_loss_logps`), the log-probs are kept, detached."""
        result = super()._get_per_token_logps_and_entropies(*args, **kwargs)
        if self._loss_logps is not None:
            self._loss_logps.append(result[0].detach())
        return result

    def _compute_loss(self, model, inputs):
        rows = inputs.get("mrl_row") if self._pending is not None else None
        self._loss_logps = [] if rows is not None else None
        try:
            loss = super()._compute_loss(model, inputs)
            captured = self._loss_logps
        finally:
            self._loss_logps = None
        if rows is not None:
            self._take_logps(rows, captured[0])          # the loss forward's, TRL's only call in _compute_loss
        if self._rescue is None or not self.model.training:
            return loss
        r = self._rescue
        logp, _, _ = self._get_per_token_logps_and_entropies(model, r.input_ids, r.attention_mask, r.mask.size(1))
        mean_nll = rescue_nll(logp.detach(), r.mask, 1.0, r.mask.size(0))      # (1/|S|) Σ_y NLL(y), logged
        self._metrics["train"]["mrl/sgt_nll"].append(mean_nll.item())
        # TRL divides each micro-batch's loss by the accumulation steps: the term adds λ·NLL(S) per optimizer step
        return loss + rescue_nll(logp, r.mask, self.mutual.lam, r.divisor) / self.current_gradient_accumulation_steps

    # --- publish --------------------------------------------------------------------------------
    @staticmethod
    def _prompt_ids(inputs, G: int) -> list[str]:
        """The prompt id of each group of G consecutive rows (TRL's RepeatSampler order)."""
        if len(inputs) % G:
            raise InvalidArgument(f"{len(inputs)} rows are not groups of num_generations={G}")
        ids = []
        for p in range(len(inputs) // G):
            group = {str(x["prompt_id"]) for x in inputs[p * G:(p + 1) * G]}
            if len(group) != 1:
                raise InvalidArgument(f"one group of {G} generations has prompt ids {sorted(group)}: each prompt's "
                                      f"rows must share one prompt_id")
            ids.append(group.pop())
        return ids

    def _publish(self, step: int, inputs, out, rewards: Tensor, completions, generate_s: float, record: dict
                 ) -> None:
        """Publish the step's four kinds; record["published"] counts what was sent. Unscorable completions are left
        out. With TRL's old_per_token_logps everything goes now; without, the rollouts wait in `_pending` for the
        loss forward's log-probs (module docstring) and `out` gets the `mrl_row` column that finds them. An
        exchange that stays unavailable past the client's retry budget loses the step (logged; its rollouts are
        then not sent either), as a dead exchange must not stop training; a refusal (token, policy, malformed)
        raises."""
        m = self.mutual
        G = self.num_generations
        old = out.get("old_per_token_logps")
        logps = None if old is None else old.float().cpu()
        ids, masks = out["completion_ids"].cpu(), out["completion_mask"].bool().cpu()
        flat = rewards.tolist()
        groups, rows = [], []
        for p in range(len(inputs) // G):
            scored = [i for i in range(p * G, (p + 1) * G) if flat[i] == flat[i]]      # NaN ≠ NaN: unscorable
            if scored:
                rows += scored
                groups.append(Group(
                    prompt_id=str(inputs[p * G]["prompt_id"]), prompt_text=_prompt_text(inputs[p * G]["prompt"]),
                    responses=[Response(_text(completions[i]), ids[i][masks[i]].tolist(),
                                        () if logps is None else logps[i][masks[i]].tolist()) for i in scored],
                    rewards=[flat[i] for i in scored], answers=[""] * len(scored)))
        record["published"] = 0
        if not rows:
            self._finish(record)
            return
        self._rollouts_total += len(rows)
        self._batch_rewards = (self._batch_rewards + [sum(flat[i] for i in rows) / len(rows)])[-m.window:]
        experiences = step_experiences(
            groups, run_id=m.run_id, policy=m.policy, step=step, version=step, tokenizer_id=m.tokenizer_id,
            batch_rewards=self._batch_rewards, window=m.window, rollouts_per_s=len(rows) / generate_s,
            tokens_per_s=int(masks.sum()) / generate_s, rollouts_total=self._rollouts_total)
        later = [e for e in experiences if kind_of(e) == "rollout"] if logps is None else []
        now = [e for e in experiences if kind_of(e) != "rollout"] if later else experiences
        if self._send(step, now, f"{len(experiences)} experiences"):
            record["published"] = len(now)
        else:
            later = []                                   # the step is lost
        if not later:
            self._finish(record)
            return
        self._pending = _Pending(step, record, later, rows, masks, torch.zeros(masks.shape),
                                 torch.zeros(len(flat), dtype=torch.bool))
        out["mrl_row"] = torch.arange(len(flat), device=out["completion_ids"].device)

    def _take_logps(self, rows: Tensor, logps: Tensor) -> None:
        """Rows of the pending step through TRL's loss forward, with its per-token log-probs (the π_old of TRL's
        loss, before any optimizer step): once every row has passed, the rollouts get theirs and are sent."""
        p = self._pending
        rows = rows.cpu()
        p.logps[rows] = logps.float().cpu()
        p.seen[rows] = True
        if not bool(p.seen.all()):
            return
        self._pending = None
        for e, i in zip(p.rollouts, p.rows):
            e.rollout.logprobs.extend(p.logps[i][p.masks[i]].tolist())
        if self._send(p.step, p.rollouts, f"{len(p.rollouts)} rollouts"):
            p.record["published"] += len(p.rollouts)
        self._finish(p.record)

    def _abandon(self, why: str) -> None:
        """The pending rollouts will not get their log-probs: they are not published (logged)."""
        p, self._pending = self._pending, None
        log.warning("step %d: its %d rollouts are not published: %s", p.step, len(p.rollouts), why)
        self._finish(p.record)

    def _send(self, step: int, experiences: list, what: str) -> bool:
        """Publish; False (logged) when the exchange stays unavailable past the client's retry budget. The step
        counts as unpublished; at max_unpublished_steps consecutive ones, Unavailable stops the training."""
        try:
            self.mutual.exchange.publish(experiences)
        except Unavailable as exc:
            self._unpublished += 1
            limit = self.mutual.max_unpublished_steps
            log.warning("step %d: its %s are not published (%d step(s) in a row; training stops at %s): %s", step,
                        what, self._unpublished, limit or "no limit", exc)
            if limit and self._unpublished >= limit:
                raise Unavailable(f"the exchange took nothing for {limit} steps in a row (max_unpublished_steps): "
                                  f"stopping rather than training solo; last error: {exc}") from exc
            return False
        self._unpublished = 0
        return True

    def _finish(self, record: dict) -> None:
        """The step's publishing is done: its count and the consecutive unpublished steps go to TRL's logs."""
        record["unpublished_steps"] = self._unpublished
        self._metrics["train"]["mrl/published"].append(float(record["published"]))
        self._metrics["train"]["mrl/unpublished_steps"].append(float(self._unpublished))

    # --- sharing ----------------------------------------------------------------------------------
    def _xgrpo(self, advantages: Tensor, rewards: Tensor, arrived: Arrived, prompt_ids: list[str]
               ) -> tuple[Tensor, dict]:
        """Each prompt the peers scored gets its pooled advantages; the others keep TRL's."""
        G = self.num_generations
        advantages = advantages.clone()
        pooled = uniform = used = 0
        for p, pid in enumerate(prompt_ids):
            entries = [e for e in arrived.entries.get(pid, {}).values() if e.group_rewards]
            peer = [r for e in entries for r in e.group_rewards]
            pooled += G + len(peer)
            if not peer:
                continue
            used += len(entries)
            a, moved = pooled_advantages(rewards[p], peer, self.scale_rewards == "group", self.mutual.uniform_groups)
            advantages[p * G:(p + 1) * G] = a.to(advantages.device, advantages.dtype)
            uniform += moved
        return advantages, {"xgrpo_pooled": pooled / max(len(prompt_ids), 1), "xgrpo_uniform": uniform,
                            "peer_experiences_used": used}

    def _sgt(self, inputs, out, rewards: Tensor, arrived: Arrived, prompt_ids: list[str]) -> dict:
        """The rescue set: per prompt whose own success rate ≤ τ, at most per_prompt peer successes that this
        trainer's reward functions verify again (reward ≥ success_reward), in its own tokens."""
        m, G = self.mutual, self.num_generations
        candidates = []                                  # (prompt index, VerifiedSuccess)
        for p, pid in enumerate(prompt_ids):
            own = rewards[p][~torch.isnan(rewards[p])]
            rate = float((own >= m.success_reward).float().mean()) if own.numel() else 0.0
            if rate <= m.tau:
                candidates += [(p, s) for e in arrived.entries.get(pid, {}).values() for s in e.successes]
        stats = {"sgt_rescued": 0, "sgt_accepted": 0, "sgt_rejected": 0, "peer_experiences_used": 0}
        if not candidates:
            return stats
        own_ids, _, thl = self._retokenize([(s.tokenizer_id, list(s.token_ids)) for _, s in candidates])
        verified = self._verify(inputs, [(p * G, s.response_text, ids) for (p, s), ids in zip(candidates, own_ids)])
        kept: dict[int, list[list[int]]] = {}
        for (p, _), ids, ok in zip(candidates, own_ids, verified):
            stats["sgt_accepted" if ok else "sgt_rejected"] += 1
            if ok and ids and len(kept.setdefault(p, [])) < m.per_prompt:
                kept[p].append(ids)
        rescued = [(p, ids) for p, rows in kept.items() for ids in rows]
        stats.update(thl, sgt_rescued=sum(bool(rows) for rows in kept.values()), peer_experiences_used=len(rescued))
        if rescued:
            prompts = [out["prompt_ids"][p * G][out["prompt_mask"][p * G].bool()] for p, _ in rescued]
            responses = [torch.tensor(ids, device=prompts[0].device) for _, ids in rescued]
            pad = self._tokenizer.pad_token_id
            left, right = _pad(prompts, pad, left=True), _pad(responses, pad, left=False)
            prompt_mask = _pad([torch.ones_like(x) for x in prompts], 0, left=True)
            mask = _pad([torch.ones_like(x) for x in responses], 0, left=False)
            self._rescue = _Rescue(torch.cat([left, right], dim=1), torch.cat([prompt_mask, mask], dim=1), mask,
                                   len(rescued) if m.normalize == "responses" else len(prompt_ids))
        return stats

    def _verify(self, inputs, claims: list[tuple[int, str, list[int]]]) -> list[bool]:
        """Each claim (row of its prompt, text, own ids) scored by this trainer's reward functions, as its own
        completions are (TRL's _calculate_rewards: the same dataset columns as kwargs, the same weights);
        what the reward functions log while verifying stays out of TRL's completion table."""
        rows = [inputs[i] for i, _, _ in claims]
        prompts = [x["prompt"] for x in rows]
        completions = [text if not is_conversational({"prompt": x["prompt"]})
                       else [{"role": "assistant", "content": text}] for x, (_, text, _) in zip(rows, claims)]
        pending = ({k: list(v) for k, v in self._pending_extra_logs.items()},
                   {k: list(v) for k, v in self._pending_metrics.items()})
        try:
            per_func = GRPOTrainer._calculate_rewards(self, rows, prompts, completions, [ids for _, _, ids in claims])
        finally:
            for target, saved in zip((self._pending_extra_logs, self._pending_metrics), pending):
                target.clear()
                target.update(saved)
        reward = (per_func * self.reward_weights.to(per_func.device)).nansum(dim=1)
        scorable = ~torch.isnan(per_func).all(dim=1)
        return ((reward >= self.mutual.success_reward) & scorable).tolist()
