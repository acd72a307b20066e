"""Acceptance: a client generated from proto/ in another language, with its defaults, works.

The Node.js client in node_client/ (@grpc/grpc-js and @grpc/proto-loader, versions pinned in its
package.json and package-lock.json) loads proto/mrl/v1/*.proto at run time and keeps grpc-js's default
channel options: at most 4 MiB received per message. It publishes, subscribes and acks 64 rollouts of
100 KB each against a real exchange. `npm install` fills node_client/node_modules (git-ignored) once; a
machine without node and npm, or without the npm registry for that first install, fails here: it does
not skip.
"""
import json
import pathlib
import shutil
import subprocess

import pytest

from mrl.exchange_client import ExchangeClient

pytestmark = pytest.mark.slow

NODE_CLIENT = pathlib.Path(__file__).parent / "node_client"


@pytest.fixture(scope="module")
def node():
    node, npm = shutil.which("node"), shutil.which("npm")
    assert node and npm, "the foreign-client test needs Node.js (20 or newer) and npm on PATH"
    proc = subprocess.run([npm, "install", "--no-audit", "--no-fund"], cwd=NODE_CLIENT, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, f"npm install failed in {NODE_CLIENT} (is the npm registry reachable?):\n" \
                                 f"{proc.stdout[-2000:]}{proc.stderr[-4000:]}"
    return node


def test_a_node_client_with_default_settings_publishes_subscribes_and_acks_64_rollouts_of_100_kb(
        node, exchange, run_id):
    proc = subprocess.run([node, "client.js", exchange.target, run_id], cwd=NODE_CLIENT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {"published": 64, "delivered": 64, "acked": 64}
    with ExchangeClient(exchange.target) as see:
        [stats] = see.topic_stats(run_id)
    assert stats.length == 64
    assert [(g.subscriber, g.pending, g.lag) for g in stats.groups] == [("node-b", 0, 0)]
