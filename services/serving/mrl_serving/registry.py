"""The services installed in this environment, found through the entry points `mrl.services`.

Each service package declares one entry point, its topology name → its settings class:

    [project.entry-points."mrl.services"]
    exchange = "mrl_exchange.settings:ExchangeSettings"

The settings class carries what a launcher needs to start the service as a child process:
its default ports (the `port` and `admin_port` fields), `command` (the `mrl` words that serve
it) and `needs_redis`. Nothing here imports a service until it is asked for.
"""
from importlib.metadata import entry_points

from mrl.errors import NotFound
from mrl_serving.settings import ServerSettings

__all__ = ["GROUP", "installed_services", "service_settings"]

GROUP = "mrl.services"


def installed_services() -> dict[str, type[ServerSettings]]:
    """Every installed service's settings class by name, in the order of their default gRPC ports (exchange,
    tokenizer_align, scheduler): the order a launcher starts them in."""
    services = {ep.name: ep.load() for ep in entry_points(group=GROUP)}
    return dict(sorted(services.items(), key=lambda item: item[1].model_fields["port"].default))


def service_settings(name: str) -> type[ServerSettings]:
    """The settings class of service `name` (NotFound if no installed package declares it)."""
    found = {ep.name: ep for ep in entry_points(group=GROUP)}
    if name not in found:
        raise NotFound(f"no installed service is called {name!r} (installed: {', '.join(sorted(found)) or 'none'}); "
                       f"install its package, e.g. pip install -e services/{name}")
    return found[name].load()
