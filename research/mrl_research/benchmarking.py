"""What every benchmark shares: a description of the machine it ran on, and cleaning up after itself."""
import os
import platform

import redis
from redis.utils import HIREDIS_AVAILABLE

__all__ = ["machine", "delete_keys"]


def machine(redis_url: str | None = None, libraries: str = "") -> str:
    """OS, cores and CPU model, Python; the Redis server and client when `redis_url` is given; then `libraries`."""
    cpu = platform.processor()
    if os.path.exists("/proc/cpuinfo"):
        cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
                   cpu)
    parts = [f"{platform.system()} {platform.machine()}, {os.cpu_count()} cores ({cpu}), Python "
             f"{platform.python_version()}"]
    if redis_url:
        client = redis.Redis.from_url(redis_url)
        parts.append(f"redis-server {client.info('server').get('redis_version')}, redis-py {redis.__version__} "
                     f"({'hiredis' if HIREDIS_AVAILABLE else 'pure-Python'} parser)")
        client.close()
    if libraries:
        parts.append(libraries)
    return ", ".join(parts)


def delete_keys(redis_url: str, patterns: list[str]) -> None:
    """Unlink every key matching one of `patterns` (a benchmark's own, fresh names); never FLUSH anything."""
    client = redis.Redis.from_url(redis_url)
    for pattern in patterns:
        keys = list(client.scan_iter(match=pattern, count=1000))
        for i in range(0, len(keys), 500):
            client.unlink(*keys[i:i + 500])
    client.close()
