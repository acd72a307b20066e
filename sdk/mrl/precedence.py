"""One precedence for every connection setting, in the SDK clients, the trainer and the TRL example alike:

    explicit argument  >  environment  >  config file  >  default

    explicit     a client's `token=` argument, a command's flag (`--token`), `--set exchange.token=...`
    environment  MRL_TOKEN (every token), MRL_EXCHANGE_TARGET, MRL_ALIGN_TARGET, MRL_SCHEDULER_TARGET,
                 MRL_TLS_ROOT_CERT (a PEM file: TLS to every service)
    config file  a trainer config's exchange.token / .target, sharing.align.*, scheduler.*
    default      none: no token sent, plaintext; a target has no default

Every value keeps the name of where it came from (`Setting.source`), and every auth or connection error names
it (mrl.grpc_client.Connection.where): "the exchange at host:50051 (plaintext, token from MRL_TOKEN)".
"""
import os
from dataclasses import dataclass
from typing import Any

__all__ = ["ENVIRONMENT", "Setting", "resolve"]

# a trainer config's connection settings → the environment variable that overrides its file's value
ENVIRONMENT = {"exchange.token": "MRL_TOKEN", "scheduler.token": "MRL_TOKEN", "sharing.align.token": "MRL_TOKEN",
               "exchange.target": "MRL_EXCHANGE_TARGET", "scheduler.target": "MRL_SCHEDULER_TARGET",
               "sharing.align.target": "MRL_ALIGN_TARGET"}


@dataclass(frozen=True)
class Setting:
    value: Any
    source: str           # "--token", "MRL_TOKEN", "exchange.token in policy-a.yaml", "default"


def resolve(explicit: Any = None, explicit_name: str = "the argument", env: str | None = None, file: Any = None,
            file_name: str = "the config file", default: Any = None) -> Setting:
    """The first of explicit, the environment variable `env` (set and not empty), the file's value, the default
    that is not None, and where it came from."""
    if explicit is not None:
        return Setting(explicit, explicit_name)
    if env and os.environ.get(env):
        return Setting(os.environ[env], env)
    if file is not None:
        return Setting(file, file_name)
    return Setting(default, "default")
