"""The trainer's clients of the services, made from its config, and the connection check before any work.

    check_connections(config, exchange)   # before the model is loaded: each configured service, one WhoAmI
    scheduler_client(config) / align_client(config)

Each client names where its target and token came from (config.source: mrl.precedence), so a refusal says which
address was tried and which token was sent; THL's token is sharing.align.token, or else the exchange's.
"""
from mrl.align_client import AlignClient
from mrl.scheduler_client import SchedulerClient
from mrl_trainer.config import TrainerConfig

__all__ = ["align_client", "check_connections", "scheduler_client"]


def scheduler_client(config: TrainerConfig) -> SchedulerClient:
    return SchedulerClient(config.scheduler.target, config.scheduler.token, run_id=config.run_id,
                           policy=config.policy, token_source=config.source("scheduler.token"),
                           target_source=config.source("scheduler.target"))


def align_client(config: TrainerConfig) -> AlignClient:
    align = config.sharing.align
    return AlignClient(align.target, align.token or config.exchange.token,
                       token_source=config.source("sharing.align.token"),
                       target_source=config.source("sharing.align.target"))


def check_connections(config: TrainerConfig, exchange) -> None:
    """One round trip to each service the config names (mrl.connection), as this policy in this run: an address,
    TLS setting, token or policy that is wrong stops the trainer here, with what to fix, before a model is
    loaded."""
    if exchange is not None:
        exchange.check(config.run_id, config.policy)
    if config.sharing.align is not None and config.sharing.mode != "none":
        with align_client(config) as client:
            client.check()
    if config.scheduler is not None:
        with scheduler_client(config) as client:
            client.check()
