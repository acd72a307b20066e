"""`mrl trainer run CONFIG`: train one policy until its steps are done or SIGINT/SIGTERM arrives.

A signal finishes the step under way, writes a checkpoint and exits 0 (during a warm start, not under
torchrun: stops it before its next supervised step, caching nothing, and exits 0 at step 0); a bad config, model or
data, a verifier that raises or a non-finite loss prints one clear error and exits 2, leaving the
last checkpoint intact (a NaN step is never checkpointed). The last line printed is a JSON summary;
its `unpublished` counts the experiences still waiting in the outbox (outbox.py) for the exchange.

With an exchange, experience an earlier run left in the outbox is sent first. Each publish is
retried for PUBLISH_BUDGET_S, enough to ride out an exchange restart; past that the step's
experience waits in the outbox and training goes on.

Under torchrun (`torchrun --nproc-per-node N -m mrl.cli trainer run CONFIG`) every rank runs this: the
policy is sharded over the N ranks (mrl_trainer.distributed), rank 0 alone connects to the exchange and
prints the summary.

`mrl trainer warm-start CONFIG` does the run's warm start (warm_start set, no checkpoint to resume) into
the model cache and exits, printing {"policy", "warm_start": none | uncached | resumes | cached | trained |
stopped} ("uncached": warm_start.cache is false, so `run` trains it itself): a launcher runs it for every
policy first, so that no policy takes its first step while a peer it waits for is still warm-starting.
"""
import contextlib
import json
import logging
import signal
import sys
import threading

import yaml

from mrl_trainer.config import load_config
from mrl_trainer.connections import check_connections
from mrl_trainer.errors import TrainerError
from mrl_trainer.outbox import Outbox
from mrl_trainer.sft import WarmStartStopped

__all__ = ["run", "warm_start", "parse_overrides"]

PUBLISH_BUDGET_S = 10.0


def parse_overrides(pairs: list[str]) -> dict:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise TrainerError(f"--set {pair!r}: expected KEY=VALUE, e.g. --set steps=20")
        try:
            out[key] = yaml.safe_load(value)
        except yaml.YAMLError as exc:
            raise TrainerError(f"--set {pair!r}: the value is not valid YAML ({getattr(exc, 'problem', None) or exc}); "
                               f"quote a value with YAML's special characters") from None
    return out


def run(config_path: str, overrides: dict | None = None) -> dict:
    from mrl_trainer import distributed
    from mrl_trainer.trainer import build_trainer, lease_size
    config = load_config(config_path, overrides)
    ranks = distributed.setup() if distributed.under_torchrun() else distributed.Ranks()
    rank = f" rank {ranks.rank}/{ranks.world}" if ranks.sharded else ""
    logging.basicConfig(level=logging.INFO, format=f"[{config.policy}{rank}] %(message)s", stream=sys.stderr)
    stop = _stop_on_signals()
    state = trainer = None
    with contextlib.ExitStack() as stack:
        if ranks.sharded:
            stack.push(lambda failed, *_: distributed.teardown(wait=failed is None))
        lease_size(config, ranks)           # a config the trainer refuses fails before any connection is made
        exchange = None
        if config.exchange and ranks.main:
            from mrl.exchange_client import Backoff, ExchangeClient
            exchange = stack.enter_context(ExchangeClient(
                config.exchange.target, config.exchange.token, token_source=config.source("exchange.token"),
                target_source=config.source("exchange.target"),
                backoff=Backoff(attempts=None, budget_s=PUBLISH_BUDGET_S)))
        if ranks.main:
            check_connections(config, exchange)
        try:
            trainer = build_trainer(config, exchange=exchange, ranks=ranks, should_stop=stop.is_set)
        except WarmStartStopped as exc:
            print(f"mrl trainer: {exc}; nothing cached", file=sys.stderr)
        if trainer is not None:
            stack.callback(trainer.close)
            if trainer.resumed_from and ranks.main:
                print(f"mrl trainer: resumed from {trainer.resumed_from} at step {trainer.state.step}",
                      file=sys.stderr)
            if exchange is not None:
                _send_outbox(trainer)
            state = trainer.run(should_stop=stop.is_set)
    step = state.step if state else 0
    summary = {"policy": config.policy, "step": step, "steps": config.steps,
               "rollouts_total": state.rollouts_total if state else 0, "stopped_early": step < config.steps,
               "unpublished": Outbox(config.checkpoint.dir).pending(), "ranks": ranks.world,
               "checkpoint_dir": config.checkpoint.dir,
               "metrics": str(trainer.metrics.path) if trainer and trainer.metrics else None}
    if ranks.main:
        print(json.dumps(summary), flush=True)
    return summary


def warm_start(config_path: str, overrides: dict | None = None) -> dict:
    """`mrl trainer warm-start`: the run's warm start alone (module docstring); prints and returns its outcome."""
    from mrl_trainer.trainer import prepare_warm_start
    config = load_config(config_path, overrides)
    logging.basicConfig(level=logging.INFO, format=f"[{config.policy}] %(message)s", stream=sys.stderr)
    stop = _stop_on_signals()
    try:
        outcome = prepare_warm_start(config, should_stop=stop.is_set)
    except WarmStartStopped as exc:
        print(f"mrl trainer: {exc}; nothing cached", file=sys.stderr)
        outcome = "stopped"
    result = {"policy": config.policy, "warm_start": outcome}
    print(json.dumps(result), flush=True)
    return result


def _stop_on_signals() -> threading.Event:
    """An Event that SIGINT and SIGTERM set (the loop and the warm start ask it between steps)."""
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    return stop


def _send_outbox(trainer) -> None:
    """Send what an earlier run left in the outbox; a batch the exchange refuses is set aside, not fatal."""
    try:
        sent = trainer.publish([])
    except TrainerError as exc:
        print(f"mrl trainer: warning: {exc}", file=sys.stderr)
        return
    if sent:
        print(f"mrl trainer: sent {sent} experiences an earlier run left in the outbox", file=sys.stderr)
