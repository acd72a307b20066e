"""Settings of the exchange (env `MRL_*`, or the YAML file named by `MRL_CONFIG`)."""
from typing import ClassVar

from pydantic import Field, field_validator, model_validator

from mrl_serving.settings import ServerSettings, name_setting

__all__ = ["ExchangeSettings"]


class ExchangeSettings(ServerSettings):
    command: ClassVar[tuple[str, ...]] = ("exchange", "serve")
    port: int = Field(50051, ge=0, le=65535, description="gRPC port; 0 picks a free one.")
    admin_port: int = Field(8080, ge=0, le=65535, description="REST port; 0 picks a free one.")
    max_experience_bytes: int = Field(1 << 20, gt=0, description="Largest single serialized experience.")
    max_tokens: int = Field(65536, gt=0, description="Most token ids in one rollout or success.")
    max_batch: int = Field(1024, gt=0, description="Most experiences in one Publish.")
    visibility_timeout_s: float = Field(30.0, gt=0, description="Un-acked deliveries are delivered again "
                                                                 "after this idle time (XAUTOCLAIM).")
    default_max_in_flight: int = Field(256, gt=0, description="Credit when a subscriber asks for 0.")
    max_in_flight_limit: int = Field(8192, gt=0, description="Most credit a subscriber may ask for.")
    retention_maxlen: int = Field(100_000, gt=0, description="Approximate most entries kept per stream.")
    retention_max_age_s: float = Field(0, ge=0, description="Drop entries older than this (0: no age limit).")
    dedupe_ttl_s: int = Field(3600, gt=0, description="How long an experience id is remembered for idempotent "
                                                       "retries (one small Redis key per experience meanwhile).")
    success_library_per_prompt: int = Field(8, ge=0, description="Newest verified successes kept per (prompt, "
                                            "producer) for GetSuccesses, beyond the streams' retention "
                                            "(0: no success library; GetSuccesses answers FAILED_PRECONDITION).")
    success_library_ttl_s: int = Field(7 * 24 * 3600, gt=0, description="A (prompt, producer)'s successes "
                                       "are dropped this long after its last success was published.")
    max_subscriptions: int = Field(512, gt=0, description="Most open subscriptions on this replica.")
    max_subscriptions_per_principal: int = Field(64, gt=0, description="Most open subscriptions per principal.")
    rate_limit_scope: str = Field("exchange", description="Rate buckets live in Redis under "
                                  "mrl:rl:<scope>:<principal>: replicas of one exchange share a scope (so a "
                                  "principal gets rate_limit_per_s however many it reaches); give another "
                                  "deployment on the same Redis its own.")

    @field_validator("rate_limit_scope")
    @classmethod
    def _scope(cls, value: str) -> str:
        return name_setting("rate_limit_scope", value)

    @model_validator(mode="after")
    def _credit_bounds(self):
        if self.default_max_in_flight > self.max_in_flight_limit:
            raise ValueError(f"default_max_in_flight ({self.default_max_in_flight}) must be <= "
                             f"max_in_flight_limit ({self.max_in_flight_limit})")
        if self.max_experience_bytes > self.max_message_bytes - (64 << 10):
            raise ValueError(f"max_experience_bytes ({self.max_experience_bytes}) must leave 64 KiB of "
                             f"max_message_bytes ({self.max_message_bytes}) for the envelope of a delivery")
        if self.rate_limit_burst < self.max_batch:
            raise ValueError(f"rate_limit_burst ({self.rate_limit_burst}) must be >= max_batch "
                             f"({self.max_batch}), or a full batch could never be published")
        return self
