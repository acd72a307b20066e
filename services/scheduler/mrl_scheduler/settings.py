"""Settings of the scheduler, MWRA (env `MRL_*`, or the YAML file named by `MRL_CONFIG`)."""
import re
import socket
from typing import ClassVar, Literal

from pydantic import BaseModel, Field, field_validator, model_validator

from mrl_serving.settings import ServerSettings, name_setting

__all__ = ["NodeSpec", "SchedulerSettings", "default_node"]


def default_node() -> str:
    """This host's name as a node name (1-64 of [A-Za-z0-9._-])."""
    name = re.sub(r"[^A-Za-z0-9._-]", "-", socket.gethostname()).lstrip("._-")[:64]
    return name or "node-0"


class NodeSpec(BaseModel):
    """A node declared in config: `slots` devices of `memory_bytes` each."""

    slots: int = Field(..., gt=0, le=4096, description="How many devices the node has.")
    memory_bytes: int = Field(0, ge=0, description="Memory of each device (0: unknown).")
    kind: Literal["slot", "cuda"] = Field("slot", description="'cuda' for GPUs, 'slot' for declared CPU slots.")


class SchedulerSettings(ServerSettings):
    command: ClassVar[tuple[str, ...]] = ("scheduler", "serve")
    port: int = Field(50053, ge=0, le=65535, description="gRPC port; 0 picks a free one.")
    admin_port: int = Field(8082, ge=0, le=65535, description="REST port; 0 picks a free one.")
    namespace: str = Field("default", description="Scheduler state in Redis lives under mrl:sched:{namespace}:; "
                                                  "replicas sharing a namespace share the devices.")
    inventory: Literal["auto", "nvml", "slots"] = Field(
        "auto", description="This node's devices: 'nvml' (the GPUs NVML sees, with their memory), 'slots' "
                            "(`slots` declared devices), 'auto' (NVML when it finds GPUs, else slots).")
    node: str = Field(default_factory=default_node, description="This replica's node name (default: the host name).")
    slots: int = Field(0, ge=0, le=4096, description="Declared devices of this node when it has no GPUs (CPU-only "
                                                      "runs and tests); 0: none.")
    slot_memory_bytes: int = Field(0, ge=0, description="Memory reported for each declared slot.")
    nodes: dict[str, NodeSpec] = Field(default_factory=dict, description="Other nodes' devices declared in config "
                                       "(JSON object in the env): name -> {slots, memory_bytes, kind}.")
    weights: dict[str, float] = Field(default_factory=dict, description="Fair-share weight per policy; a policy not "
                                      "listed weighs its declared step_cost, or 1.")
    default_ttl_s: float = Field(30.0, gt=0, description="Lease TTL when a request asks for 0.")
    max_ttl_s: float = Field(600.0, gt=0, description="Longest lease TTL a request may ask for.")
    default_wait_s: float = Field(60.0, gt=0, description="How long Acquire waits when a request asks for 0.")
    max_wait_s: float = Field(3600.0, gt=0, description="Longest wait_timeout a request may ask for.")
    aging: float = Field(1.0, ge=0, description="Aging: a second of waiting counts as `aging` seconds of a fair "
                                                "share of the devices (fairshare.py); 0 turns aging off.")
    backfill_slack: float = Field(0.5, ge=0, le=1, description="How far past a reserved request's expected start "
                                  "a backfill may run, as a fraction of its expected lease length (fairshare.py): "
                                  "utilization against its start delay; 0 is strict EASY backfilling.")
    anticipation_s: float = Field(0.1, ge=0, le=10, description="A policy that releases a lease counts as "
                                  "still active this long, and while it would come first in the fair-share "
                                  "order its devices wait for its next request (fairshare.py): a policy that "
                                  "asks again at once keeps its place and its credit, so device time follows "
                                  "the weights whatever the lease lengths; 0 turns it off.")
    sweep_interval_s: float = Field(0.25, gt=0, description="How often a replica sweeps expired leases and "
                                                            "abandoned requests and grants what it can.")
    request_liveness_s: float | None = Field(
        None, gt=0, description="A waiting request is dropped, never granted, this long after the replica serving "
                                "its Acquire last renewed it (every sweep): a replica that dies (kill -9) leaves no "
                                "lease that no caller holds. Unset: max(2, 8 × sweep_interval_s).")
    max_devices: int = Field(1024, gt=0, description="Most devices in one request.")
    max_step_cost: float = Field(1e6, gt=0, description="Largest declared step_cost.")
    max_queue: int = Field(100_000, gt=0, description="Most requests waiting in the namespace.")
    max_queue_per_policy: int = Field(10_000, gt=0, description="Most requests of one policy waiting in the "
                                                                 "namespace, so one policy cannot fill the queue.")
    max_waiting: int = Field(4096, gt=0, description="Most Acquire calls waiting on this replica.")
    max_watchers: int = Field(256, gt=0, description="Most Watch streams open on this replica.")
    max_grants_per_pass: int = Field(512, gt=0, description="Most grants one scheduling pass makes (bounds the "
                                                            "time one Lua call holds Redis).")
    events_maxlen: int = Field(100_000, gt=0, description="Approximate most lease events kept in Redis.")
    tombstone_s: int = Field(3600, gt=0, description="How long an ended lease is remembered (so a late renew "
                                                     "hears 'lost', not 'unknown').")

    @field_validator("namespace", "node")
    @classmethod
    def _names(cls, value: str, info) -> str:
        return name_setting(info.field_name, value)

    @field_validator("nodes")
    @classmethod
    def _node_names(cls, value: dict) -> dict:
        for name in value:
            name_setting("nodes key", name)
        return value

    @field_validator("weights")
    @classmethod
    def _weights(cls, value: dict) -> dict:
        for policy, w in value.items():
            name_setting("weights key", policy)
            if w <= 0:
                raise ValueError(f"weights[{policy!r}] is {w}: a weight must be > 0")
        return value

    @model_validator(mode="after")
    def _bounds(self):
        if self.default_ttl_s > self.max_ttl_s:
            raise ValueError(f"default_ttl_s ({self.default_ttl_s}) must be <= max_ttl_s ({self.max_ttl_s})")
        if self.default_wait_s > self.max_wait_s:
            raise ValueError(f"default_wait_s ({self.default_wait_s}) must be <= max_wait_s ({self.max_wait_s})")
        if self.request_liveness_s is None:
            self.request_liveness_s = max(2.0, 8 * self.sweep_interval_s)
        if self.request_liveness_s < 4 * self.sweep_interval_s:
            raise ValueError(f"request_liveness_s ({self.request_liveness_s}) must be >= 4 x sweep_interval_s "
                             f"({self.sweep_interval_s}): a replica renews its waiting requests once a sweep")
        if self.node in self.nodes:
            raise ValueError(f"node {self.node!r} is this replica's own node: describe it with inventory/slots, "
                             f"not in `nodes`")
        return self
