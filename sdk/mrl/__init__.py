"""mrl — the client SDK of the mutual RL platform: what another lab's trainer needs to join a run.

    mrl.ExchangeClient / AsyncExchangeClient   publish, subscribe to and ack typed experience (SEE)
    mrl.SchedulerClient                        lease devices from the scheduler (MWRA)
    mrl.AlignClient                            retokenize text and traces between tokenizers (THL)
    mrl.experience                             build and validate experience messages (rollout,
                                               group_stats, success, policy_stats)
    mrl.errors                                 one error class per gRPC status
    mrl.auth                                   bearer tokens and the principals of an auth file
    mrl.v1                                     the generated protobuf / gRPC stubs (proto/mrl/v1)

`pip install ./sdk` installs this client alone (grpcio, protobuf, pydantic, pyyaml); the services
and the launcher are separate packages.
"""
from importlib.metadata import PackageNotFoundError, version

from mrl import errors, experience
from mrl.align_client import AlignClient
from mrl.errors import MrlError
from mrl.exchange_client import AsyncExchangeClient, ExchangeClient
from mrl.scheduler_client import SchedulerClient

__all__ = ["ExchangeClient", "AsyncExchangeClient", "SchedulerClient", "AlignClient", "MrlError", "errors",
           "experience", "__version__"]

try:
    __version__ = version("mrl")
except PackageNotFoundError:      # imported from a source tree that was not installed
    __version__ = "0+unknown"
