"""The devices a scheduler hands out: GPUs found by NVML, or slots declared in config.

Each node's devices are registered into Redis as a whole set (`Scheduler.register`): every
replica registers its own node at start, and config may declare further nodes (`nodes:`);
an admin can (re)register or remove a node over REST. A device is `node/gpu-i` (NVML index i)
or `node/slot-i`; GPUs and slots take the same path through the scheduler, so CPU-only runs
and tests exercise exactly what a GPU cluster runs.

NVML enumerates GPUs in PCI bus order; a lease sets CUDA_DEVICE_ORDER=PCI_BUS_ID with
CUDA_VISIBLE_DEVICES, so the indexes name the same GPUs for CUDA (scheduler_client.py).
"""
import dataclasses
import logging

import pynvml

from mrl.errors import InvalidArgument
from mrl_scheduler.settings import SchedulerSettings

__all__ = ["DeviceSpec", "nvml_devices", "slot_devices", "configured_nodes"]

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class DeviceSpec:
    node: str
    index: int
    memory_bytes: int
    kind: str  # "cuda" or "slot"

    @property
    def device_id(self) -> str:
        return f"{self.node}/{'gpu' if self.kind == 'cuda' else 'slot'}-{self.index}"


def nvml_devices(node: str) -> list[DeviceSpec]:
    """The GPUs NVML sees on this host, with their total memory; [] when there is no driver or no GPU."""
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        log.info("NVML is not available (%s): no GPUs on this host", exc)
        return []
    try:
        return [DeviceSpec(node, i, int(pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(i)).total),
                           "cuda") for i in range(pynvml.nvmlDeviceGetCount())]
    finally:
        pynvml.nvmlShutdown()


def slot_devices(node: str, slots: int, memory_bytes: int = 0, kind: str = "slot") -> list[DeviceSpec]:
    return [DeviceSpec(node, i, memory_bytes, kind) for i in range(slots)]


def configured_nodes(settings: SchedulerSettings) -> dict[str, list[DeviceSpec]]:
    """node -> devices: this replica's node (NVML or slots, per `inventory`), then the declared `nodes`."""
    own: list[DeviceSpec] = []
    if settings.inventory in ("auto", "nvml"):
        own = nvml_devices(settings.node)
        if not own and settings.inventory == "nvml":
            raise InvalidArgument("inventory is 'nvml' but NVML finds no GPU on this host: install the NVIDIA "
                                  "driver, or set inventory to 'slots' (or 'auto') with `slots`")
    if not own:
        own = slot_devices(settings.node, settings.slots, settings.slot_memory_bytes)
    nodes = {settings.node: own}
    for name, spec in settings.nodes.items():
        nodes[name] = slot_devices(name, spec.slots, spec.memory_bytes, spec.kind)
    return nodes
