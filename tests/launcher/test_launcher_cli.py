"""Smoke runs of the launcher's commands: up, demo, their Ctrl-C, children that die with them, spawn."""
import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest
import yaml

from helpers import ROOT


def test_up_runs_the_topology_and_stops_cleanly_on_ctrl_c(tmp_path):
    config = tmp_path / "local.yaml"
    config.write_text(yaml.safe_dump({"data_dir": str(tmp_path / "d"), "exchange": {"port": 0, "admin_port": 0},
                                      "tokenizer_align": {"port": 0, "admin_port": 0},
                                      "scheduler": {"port": 0, "admin_port": 0, "slots": 2}}))
    proc = subprocess.Popen([sys.executable, "-m", "mrl.cli", "up", str(config)], stdout=subprocess.PIPE, text=True)
    try:
        first = proc.stdout.readline()
        assert first.startswith("mrl up: redis unix://"), first
        assert "exchange         gRPC 127.0.0.1:" in proc.stdout.readline()
        assert "tokenizer_align  gRPC 127.0.0.1:" in proc.stdout.readline()
        assert "scheduler        gRPC 127.0.0.1:" in proc.stdout.readline()
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=60)     # a stop that hangs fails here, with what was printed
        assert proc.returncode == 0, rest
        assert "mrl up: stopped" in rest
    finally:
        proc.kill()
    assert not (tmp_path / "d" / "redis" / "redis.sock").exists()  # Redis was shut down too


def test_a_ctrl_c_while_the_launcher_holds_the_stop_events_lock_still_stops_it():
    """The launcher's main thread waits on the stop Event (holding its lock for a moment each time); a SIGINT that
    lands in that moment must still set it. A handler that called Event.set itself blocked on the lock its own
    thread held: `mrl up` then never stopped (seen once in CI)."""
    code = ("import os, signal\n"
            "from mrl_launcher.topology import stop_on_signals\n"
            "with stop_on_signals() as stop:\n"
            "    with stop._cond:\n"       # as inside stop.wait(): the main thread holds the Event's lock
            "        os.kill(os.getpid(), signal.SIGINT)\n"
            "        sum(range(1000))\n"       # bytecodes: the Python-level handler runs here
            "    print('stopped' if stop.wait(10) else 'not stopped')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert out.stdout.strip() == "stopped", out.stderr


def test_demo_delivers_every_peer_experience(tmp_path):
    out = subprocess.run([sys.executable, "-m", "mrl.cli", "demo", "--exchange", "--steps", "3", "--group-size", "4"],
                         capture_output=True, text=True, timeout=120, env={"MRL_DATA_DIR": str(tmp_path),
                                                                            "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    assert "every peer experience received and acked: True" in out.stdout


def test_children_die_with_a_killed_launcher(tmp_path):
    """`mrl up` killed with SIGKILL (no cleanup runs) leaves no redis-server or exchange behind."""
    import os
    import time
    config = tmp_path / "local.yaml"
    config.write_text(yaml.safe_dump({"data_dir": str(tmp_path / "d"), "exchange": {"port": 0, "admin_port": 0},
                                      "tokenizer_align": None, "scheduler": None}))
    proc = subprocess.Popen([sys.executable, "-m", "mrl.cli", "up", str(config)], stdout=subprocess.PIPE, text=True)
    proc.stdout.readline()
    proc.stdout.readline()  # redis, then the exchange is ready
    children = [d.name for d in pathlib.Path("/proc").iterdir() if d.name.isdigit() and _ppid(d) == proc.pid]
    assert len(children) == 2  # redis-server and the exchange (the alignment service and scheduler are off)
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + 10
    alive = children
    while alive and time.monotonic() < deadline:
        time.sleep(0.1)
        alive = [pid for pid in children if os.path.exists(f"/proc/{pid}") and
                 "zombie" not in open(f"/proc/{pid}/status").read()]
    assert not alive


def _ppid(proc_dir: pathlib.Path) -> int | None:
    try:
        return int((proc_dir / "stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def test_spawn_passes_list_and_mapping_settings_as_json():
    import httpx
    from mrl_serving.processes import spawn
    from mrl_tokenizer_align.catalog import cache_dir, cached_paths
    gpt2 = cached_paths()["gpt2"]
    with spawn("tokenizer_align", tokenizer_roots=[str(cache_dir())], tokenizers={"only-gpt2": str(gpt2)}) as align:
        listed = httpx.get(f"http://127.0.0.1:{align.ready['admin_port']}/v1/tokenizers").json()["tokenizers"]
        assert [t["tokenizer_id"] for t in listed] == ["only-gpt2"]


@pytest.mark.parametrize("ranks", [1, pytest.param(2, marks=[pytest.mark.scale, pytest.mark.slow])])
def test_up_with_a_trainer_stops_it_cleanly_on_ctrl_c(tmp_path, ranks):
    """Ctrl-C in a terminal (SIGINT to the whole foreground process group): the trainer finishes the step
    under way, checkpoints and exits 0, and only then do the services and Redis stop. With `ranks: 2` the
    trainer runs under torchrun, and its ranks finish the step and checkpoint (torchrun is not what is asked)."""
    from helpers import tiny_config
    trainer = tiny_config(tmp_path, steps=10_000, exchange={"target": "set-by-mrl-up:1", "tokenizer_id": "gpt2"})
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(trainer))
    config = tmp_path / "topology.yaml"
    config.write_text(yaml.safe_dump({"data_dir": "d", "exchange": {"port": 0, "admin_port": 0},
                                      "tokenizer_align": None, "scheduler": {"port": 0, "admin_port": 0, "slots": ranks},
                                      "trainers": [{"config": "tiny.yaml", "ranks": ranks}]}))
    proc = subprocess.Popen([sys.executable, "-m", "mrl.cli", "up", str(config)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        started = "[tiny] step 2/10000" if ranks == 1 else "[tiny rank 0/2] step 2/10000"
        for line in proc.stderr:                     # the trainer's per-step log lines
            if line.startswith(started):
                break
        os.killpg(proc.pid, signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0, out
    finally:
        proc.kill()
    assert "trainer tiny: exit code 0" in out and "mrl up: stopped" in out
    summary = next(json.loads(line) for line in out.splitlines() if line.startswith('{"policy"'))
    assert summary["stopped_early"] and summary["step"] >= 2 and summary["ranks"] == ranks
    assert (tmp_path / "d" / "tiny" / "checkpoints" / "latest").is_file()
    assert not (tmp_path / "d" / "redis" / "redis.sock").exists()


def _warm_topology(tmp_path, warm_steps: int) -> pathlib.Path:
    """Two tiny trainers, `b` with a warm start of `warm_steps` steps, `a` without."""
    from helpers import tiny_config
    for policy, extra in (("a", {}), ("b", {"warm_start.steps": warm_steps, "warm_start.batch_size": 4})):
        trainer = tiny_config(tmp_path, policy=policy, **extra)
        (tmp_path / f"{policy}.yaml").write_text(yaml.safe_dump(trainer))
    config = tmp_path / "topology.yaml"
    config.write_text(yaml.safe_dump({"data_dir": "d", "exchange": None, "tokenizer_align": None,
                                      "scheduler": None, "trainers": [{"config": "a.yaml"}, {"config": "b.yaml"}]}))
    return config


def test_up_warm_starts_every_policy_before_any_trainer_starts(tmp_path):
    """A policy's first step must not wait for (or run without) a peer that is still warm-starting."""
    env = {**os.environ, "MRL_MODEL_CACHE": str(tmp_path / "models")}
    done = subprocess.run([sys.executable, "-m", "mrl.cli", "up", str(_warm_topology(tmp_path, 30))],
                          capture_output=True, text=True, timeout=170, env=env)
    assert done.returncode == 0, done.stderr
    assert "warm starts first: b" in done.stdout and "trainer b: exit code 0" in done.stdout
    lines = done.stderr.splitlines()
    trained = next(i for i, line in enumerate(lines) if line.startswith("[b] warm start: 30 steps"))
    first_step = next(i for i, line in enumerate(lines) if line.startswith(("[a] step", "[b] step")))
    assert trained < first_step
    assert "[b] warm start: loaded from the cache" in done.stderr


def test_ctrl_c_during_the_warm_starts_stops_up_before_any_trainer_starts(tmp_path):
    env = {**os.environ, "MRL_MODEL_CACHE": str(tmp_path / "models")}
    proc = subprocess.Popen([sys.executable, "-m", "mrl.cli", "up", str(_warm_topology(tmp_path, 100_000))],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env,
                            start_new_session=True)
    try:
        for line in proc.stdout:
            if "warm starts first" in line:
                break
        locks = tmp_path / "models" / ".locks"
        deadline = time.monotonic() + 90
        while not (locks.is_dir() and any(locks.iterdir())):     # b is warm-starting
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGINT)
        out, _ = proc.communicate(timeout=60)      # 100,000 warm-start steps would take hours
    finally:
        proc.kill()
    assert proc.returncode == 0, out
    assert "mrl up: stopped" in out and "trainer a" not in out and not (tmp_path / "d" / "a").exists()
    assert [p.name for p in (tmp_path / "models").iterdir()] == [".locks"]


@pytest.mark.parametrize("entry, error", [
    ({"config": "tiny.yaml", "ranks": 0}, "ranks must be a whole number >= 1"),
    ({"config": "tiny.yaml", "ranks": "two"}, "ranks must be a whole number >= 1"),
    ({"config": "tiny.yaml", "nodes": 2}, "optional `set` and `ranks`"),
])
def test_a_bad_trainers_entry_is_refused_before_anything_starts(tmp_path, entry, error):
    from helpers import tiny_config
    from mrl_launcher.errors import LauncherError
    from mrl_launcher.topology import validate_trainers
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(tiny_config(tmp_path)))
    with pytest.raises(LauncherError, match=error):
        validate_trainers({"trainers": [entry]}, tmp_path)


def test_a_solo_reference_that_is_not_a_comparison_is_refused_before_anything_starts(tmp_path):
    """`solo_reference` names the compare.json whose solo arm the live page and report draw beside the run: a
    missing one is a clear error, relative to the topology, before Redis or any service starts."""
    config = tmp_path / "up.yaml"
    config.write_text(yaml.safe_dump({"data_dir": "d", "run_id": "r1", "solo_reference": "cmp/compare.json"}))
    proc = subprocess.run([sys.executable, "-m", "mrl.cli", "up", str(config)], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode != 0 and "mrl up: redis" not in proc.stdout
    assert f"solo reference {str(tmp_path / 'cmp' / 'compare.json')!r} is not a readable compare.json" in proc.stderr
    assert not (tmp_path / "d" / "redis").exists()


@pytest.mark.parametrize("text, error", [
    ("a: [1\n", "not valid YAML"),
    ("- 1\n- 2\n", "expected a mapping of settings, got list"),
    ("just words\n", "expected a mapping of settings, got str"),
])
def test_a_topology_that_is_not_a_mapping_is_a_clear_error_in_every_command(tmp_path, text, error):
    from mrl_launcher import experiment, topology
    from mrl_research.bench import mutual as bench_mutual
    from mrl_launcher.errors import LauncherError
    path = tmp_path / "topology.yaml"
    path.write_text(text)
    for command in (lambda: topology.up(str(path)),
                    lambda: experiment.run_compare(path, ["none"], None, tmp_path / "out"),
                    lambda: bench_mutual.main(topology=str(path))):
        with pytest.raises(LauncherError, match=error):
            command()


def test_a_topology_that_cannot_be_read_as_text_is_a_clear_error(tmp_path):
    from mrl_launcher import topology
    from mrl_launcher.errors import LauncherError
    path = tmp_path / "topology.yaml"
    path.write_bytes(b"\xff\xfe\x00binary")
    with pytest.raises(LauncherError, match="cannot read it"):
        topology.up(str(path))


def test_a_trainer_config_that_is_not_a_mapping_is_refused_before_anything_starts(tmp_path):
    from mrl_launcher.errors import LauncherError
    from mrl_launcher.topology import validate_trainers
    (tmp_path / "tiny.yaml").write_text("- not\n- settings\n")
    with pytest.raises(LauncherError, match="tiny.yaml: expected a mapping of settings, got list"):
        validate_trainers({"trainers": [{"config": "tiny.yaml"}]}, tmp_path)


def test_plot_of_a_file_that_is_not_metrics_is_a_clear_error(tmp_path):
    from mrl_launcher.errors import LauncherError
    from mrl_launcher.figures import plot_curves
    path = tmp_path / "metrics.jsonl"
    path.write_text("root:x:0:0\n")
    with pytest.raises(LauncherError, match="is not a trainer metrics file"):
        plot_curves([str(path)], str(tmp_path / "x.png"))


def test_a_policy_set_in_a_trainers_entry_names_its_data_and_a_repeated_policy_is_refused(tmp_path):
    """One trainer config run as several policies (`set: {policy: …}`) writes each under its own policy's folder;
    two entries of one policy would write into one folder and are refused before anything starts."""
    from helpers import tiny_config
    from mrl_launcher import topology
    from mrl_launcher.errors import LauncherError
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(tiny_config(tmp_path)))
    config = {"data_dir": str(tmp_path / "d"),
              "trainers": [{"config": "tiny.yaml"}, {"config": "tiny.yaml", "set": {"policy": "tiny-2"}}]}
    metrics = topology.validate_trainers(config, tmp_path)
    assert metrics == {p: tmp_path / "d" / p / "metrics.jsonl" for p in ("tiny", "tiny-2")}
    config["trainers"][1]["set"]["policy"] = "tiny"
    path = tmp_path / "twice.yaml"
    path.write_text(yaml.safe_dump(config))
    for command in (lambda: topology.validate_trainers(config, tmp_path), lambda: topology.up(str(path))):
        with pytest.raises(LauncherError, match="policy 'tiny' is run by two trainers entries"):
            command()
    assert not (tmp_path / "d").exists()


TOPOLOGIES = [p for p in sorted((ROOT / "examples").glob("*.yaml")) if "trainers" in yaml.safe_load(p.read_text())]


@pytest.mark.parametrize("path", TOPOLOGIES, ids=lambda p: p.name)
def test_every_example_topology_validates(path, tmp_path):
    """Each topology in examples/ (a file with `trainers:`) names distinct policies whose settings all load."""
    from mrl_launcher.topology import validate_trainers
    config = yaml.safe_load(path.read_text())
    metrics = validate_trainers({**config, "data_dir": str(tmp_path)}, path.parent)
    assert len(metrics) == len(config["trainers"])


def test_up_with_auth_and_tls_takes_its_files_relative_to_the_topology_and_says_https(tmp_path):
    """`mrl up` of a topology naming an auth file and a certificate relative to itself, run from another folder:
    the exchange serves TLS with auth on (a policy token and the CA pass the connection check), its REST line says
    https, and data_dir is under the topology's folder too."""
    from helpers import self_signed, write_auth_file
    from mrl.exchange_client import ExchangeClient
    folder, elsewhere = tmp_path / "run", tmp_path / "elsewhere"
    folder.mkdir()
    elsewhere.mkdir()
    tokens = write_auth_file(folder / "auth.yaml", "r1")
    cert, _ = self_signed(folder, "server")
    config = folder / "up.yaml"
    config.write_text(yaml.safe_dump({"data_dir": "d", "run_id": "r1", "live_port": None, "tokenizer_align": None,
                                      "scheduler": None, "exchange": {"port": 0, "admin_port": 0,
                                      "auth_file": "auth.yaml", "tls_cert": "server.crt", "tls_key": "server.key"}}))
    env = {**os.environ, "MRL_TOKEN": tokens["admin"], "MRL_TLS_ROOT_CERT": str(cert)}
    proc = subprocess.Popen([sys.executable, "-m", "mrl.cli", "up", str(config)], stdout=subprocess.PIPE, text=True,
                            cwd=elsewhere, env=env)
    try:
        assert proc.stdout.readline().startswith("mrl up: redis unix://")
        line = proc.stdout.readline()
        assert "exchange         gRPC 127.0.0.1:" in line and "REST https://127.0.0.1:" in line, line
        port = line.split("gRPC 127.0.0.1:")[1].split()[0]
        with ExchangeClient(f"localhost:{port}", tokens["policy-a"], tls_root_cert=cert.read_bytes()) as client:
            assert client.check("r1", "policy-a").principal == "policy-a"
        assert (folder / "d" / "redis").is_dir() and not (elsewhere / "d").exists()
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0 and "mrl up: stopped" in rest, rest
    finally:
        proc.kill()
