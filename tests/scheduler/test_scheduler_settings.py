"""Scheduler settings and inventory: bad values refused at load naming the fix; NVML where GPUs exist,
declared slots otherwise; several nodes."""
import math

import pytest
from pydantic import ValidationError

from mrl.errors import InvalidArgument
from mrl_scheduler.inventory import configured_nodes, nvml_devices
from mrl_scheduler.settings import SchedulerSettings

BAD = [
    ({"default_ttl_s": 700}, "default_ttl_s"), ({"default_wait_s": 4000}, "default_wait_s"),
    ({"weights": {"pol-a": math.nan}}, "finite"), ({"weights": {"pol-a": 0.0}}, "> 0"),
    ({"weights": {"a:b": 1.0}}, "weights key"), ({"node": "node 0"}, "node"), ({"namespace": "{ns}"}, "namespace"),
    ({"nodes": {"bad/name": {"slots": 1}}}, "nodes key"), ({"nodes": {"n1": {"slots": 0}}}, "slots"),
    ({"node": "n1", "nodes": {"n1": {"slots": 1}}}, "this replica's own node"),
    ({"backfill_slack": 2}, "backfill_slack"),
    ({"request_liveness_s": 0.5, "sweep_interval_s": 0.25}, "request_liveness_s"),
    ({"max_step_cost": math.inf}, "finite"), ({"aging": math.nan}, "finite"),
    ({"rate_limit_per_s": math.inf}, "finite"),
]


@pytest.mark.parametrize("fields, says", BAD, ids=[s for _, s in BAD])
def test_bad_settings_are_refused_naming_the_field(fields, says):
    with pytest.raises((ValidationError, InvalidArgument), match=says):
        SchedulerSettings(**fields)


def test_nodes_and_weights_come_from_the_environment_as_json(monkeypatch):
    monkeypatch.setenv("MRL_NODES", '{"gpu-box": {"slots": 8, "memory_bytes": 85899345920, "kind": "cuda"}}')
    monkeypatch.setenv("MRL_WEIGHTS", '{"qwen-7b": 4}')
    s = SchedulerSettings(node="here", inventory="slots", slots=2)
    assert s.weights == {"qwen-7b": 4.0} and s.port == 50053 and s.admin_port == 8082
    nodes = configured_nodes(s)
    assert [d.device_id for d in nodes["here"]] == ["here/slot-0", "here/slot-1"]
    assert [d.device_id for d in nodes["gpu-box"]][-1] == "gpu-box/gpu-7"
    assert {d.memory_bytes for d in nodes["gpu-box"]} == {80 << 30}


@pytest.mark.skipif(bool(nvml_devices("probe")), reason="this host has GPUs")
def test_without_gpus_auto_takes_the_slots_and_nvml_refuses():
    assert [d.kind for d in configured_nodes(SchedulerSettings(node="n", inventory="auto", slots=3))["n"]] == \
        ["slot"] * 3
    with pytest.raises(InvalidArgument, match="NVML finds no GPU"):
        configured_nodes(SchedulerSettings(node="n", inventory="nvml"))


@pytest.mark.skipif(not nvml_devices("probe"), reason="no GPU on this host")
def test_with_gpus_nvml_reports_each_device_and_its_memory():
    devices = configured_nodes(SchedulerSettings(node="n", inventory="auto", slots=3))["n"]
    assert devices and all(d.kind == "cuda" and d.memory_bytes > 0 for d in devices)
    assert [d.index for d in devices] == list(range(len(devices)))


def test_request_liveness_follows_a_slower_sweep_unless_set():
    from mrl_scheduler.settings import SchedulerSettings
    assert SchedulerSettings().request_liveness_s == 2.0
    assert SchedulerSettings(sweep_interval_s=1.0).request_liveness_s == 8.0    # a slow sweep still starts
    assert SchedulerSettings(sweep_interval_s=1.0, request_liveness_s=5).request_liveness_s == 5
