"""docker-compose.yml and the services' Dockerfiles, checked statically (no Docker engine needed):
the topology, Redis persistence, build contexts, commands the `mrl` CLI knows,
ports, Redis URLs and the auth file the servers need to bind beyond loopback, health checks, the
trainers' volumes, run id and log lines, and the torch build. tests/e2e/test_compose_up.py runs it."""
import json
import pathlib
import re
import shlex
from urllib.parse import urlparse

import pytest
import yaml

from mrl import cli
from mrl.auth import Authenticator, is_loopback

ROOT = pathlib.Path(__file__).resolve().parents[2]
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SERVICES: dict = COMPOSE["services"]

EXPECTED_SERVICES = {"redis", "exchange", "tokenizer_align", "scheduler", "trainer-a", "trainer-b"}
BUILT = sorted(name for name, svc in SERVICES.items() if "build" in svc)
MRL_SERVICES = sorted(name for name in SERVICES if name != "redis")
# Services that keep state in Redis: they must be given the compose Redis.
REDIS_USERS = {"exchange", "scheduler"}


def _interpolated(value: str) -> str:
    """`value` with compose's ${VAR:-default} replaced by its default (the environment's VAR unset)."""
    return re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", value)


def _dockerfile(name: str) -> pathlib.Path:
    build = SERVICES[name]["build"]
    return ROOT / build["context"] / build["dockerfile"]


def _service_dir(name: str) -> pathlib.Path:
    return _dockerfile(name).parent


def _instructions(path: pathlib.Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of a Dockerfile, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", path.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def _stages(path: pathlib.Path) -> list[list[tuple[str, str]]]:
    """The instructions of each build stage of a Dockerfile, in order (each starts with its FROM)."""
    stages: list[list[tuple[str, str]]] = []
    for word, args in _instructions(path):
        if word == "FROM":
            stages.append([])
        stages[-1].append((word, args))
    return stages


def _cmd(path: pathlib.Path) -> list[str]:
    cmds = [args for word, args in _instructions(path) if word == "CMD"]
    assert cmds, f"{path} has no CMD"
    cmd = json.loads(cmds[-1])  # exec form only: a shell-form CMD would not get SIGTERM
    assert isinstance(cmd, list) and all(isinstance(w, str) for w in cmd), f"{path}: CMD must be a JSON list"
    return cmd


def _env(name: str) -> dict[str, str]:
    env = SERVICES[name].get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {k: str(v) for k, v in env.items()}


def _ports(name: str) -> list[tuple[int, int]]:
    """(host port, container port) of each published port (short syntax, [IP:]HOST:CONTAINER[/proto])."""
    out = []
    for spec in SERVICES[name].get("ports") or []:
        parts = str(spec).split("/")[0].split(":")
        assert len(parts) >= 2, f"{name}: publish {spec!r} with an explicit host port"
        out.append((int(parts[-2]), int(parts[-1])))
    return out


def _binds(name: str) -> list[tuple[str, str, str]]:
    """(source, target, mode) of each volume (short syntax)."""
    out = []
    for spec in SERVICES[name].get("volumes") or []:
        source, target, *mode = str(spec).split(":")
        out.append((source, target, mode[0] if mode else "rw"))
    return out


def _cli_accepts(group: str, action: str) -> bool:
    """Whether `mrl GROUP ACTION` parses (`--help` exits before anything runs)."""
    try:
        cli.main([group, action, "--help"])
    except SystemExit as exc:
        return exc.code in (0, None)
    return True


def test_service_set():
    assert set(SERVICES) == EXPECTED_SERVICES
    assert "version" not in COMPOSE, "the top-level `version` key is obsolete in the compose spec"


def test_redis_persists_with_aof():
    redis = SERVICES["redis"]
    assert redis["image"].startswith("redis:")
    command = redis["command"]
    if isinstance(command, str):
        command = shlex.split(command)
    assert any(command[i:i + 2] == ["--appendonly", "yes"] for i in range(len(command))), command
    data = [source for source, target, _ in _binds("redis") if target == "/data"]
    assert data and data[0] in (COMPOSE.get("volumes") or {}), "/data must be a declared named volume"
    assert "ping" in redis["healthcheck"]["test"]


@pytest.mark.parametrize("name", BUILT)
def test_build_context_is_repo_root(name):
    build = SERVICES[name]["build"]
    context = (ROOT / build["context"]).resolve()
    assert context == ROOT and context.is_dir()
    assert _dockerfile(name).is_file(), f"{build['dockerfile']} does not exist"
    assert _service_dir(name).parent == ROOT / "services"


@pytest.mark.parametrize("name", BUILT)
def test_dockerfile_cmd_matches_compose(name):
    cmd, command = _cmd(_dockerfile(name)), SERVICES[name]["command"]
    assert isinstance(command, list), "give the command as a list"
    # program and subcommand (`mrl trainer run`); the arguments may differ per service
    assert command[:3] == cmd[:3], f"compose runs {command}, the image's CMD is {cmd}"


@pytest.mark.parametrize("name", BUILT)
def test_dockerfile_installs_pinned_requirements_then_packages(name):
    steps = _stages(_dockerfile(name))[-1]          # the image's own stage
    assert steps[0] == ("FROM", "python:3.11-slim")
    runs = [args for word, args in steps if word == "RUN"]
    requirements = next(i for i, r in enumerate(runs) if "-r requirements.txt" in r)
    service = _service_dir(name).relative_to(ROOT).as_posix()
    packages = next(i for i, r in enumerate(runs) if f"./{service}" in r.split())
    assert requirements < packages and {"./sdk", "./services/serving"} <= set(runs[packages].split())
    assert all("--no-cache-dir" in r for r in runs if "pip install" in r)
    copied = " ".join(args for word, args in steps if word == "COPY")
    assert "requirements.txt" in copied and "sdk/" in copied and "services/serving/" in copied and f"{service}/" in copied
    users = [args for word, args in steps if word == "USER"]
    assert users and users[-1] not in ("root", "0"), "run as a non-root user"


def test_trainer_installs_pinned_torch_first():
    runs = [args for word, args in _instructions(ROOT / "services/trainer/Dockerfile") if word == "RUN"]
    torch = next(i for i, r in enumerate(runs) if "torch==" in r)
    requirements = next(i for i, r in enumerate(runs) if "-r requirements.txt" in r)
    assert torch < requirements
    makefile = (ROOT / "Makefile").read_text()
    pinned = re.search(r"^TORCH_VERSION\s*:?=\s*(\S+)", makefile, re.M).group(1)
    assert f"torch=={pinned}" in runs[torch].split(), "the image and the Makefile must pin the same torch"
    # the trainer's own pins (accelerate: GGUF loading) need torch: after it, and in the Makefile's venv too
    own = next(i for i, r in enumerate(runs) if "-r services/trainer/requirements.txt" in r)
    assert torch < own and "-r services/trainer/requirements.txt" in makefile


@pytest.mark.parametrize("dockerfile", ["services/trainer/Dockerfile", "services/tokenizer_align/Dockerfile"])
def test_torch_build_is_chosen_by_a_build_argument(dockerfile):
    """Every torch install takes pip's index from TORCH_INDEX_URL (default PyPI: the CUDA build), so a CPU host
    builds with --build-arg TORCH_INDEX_URL=<PyTorch's CPU index>."""
    installs = 0
    for stage in _stages(ROOT / dockerfile):
        args = {a.split("=", 1)[0]: a.split("=", 1)[1] for word, a in stage if word == "ARG" and "=" in a}
        for word, run in stage:
            if word == "RUN" and "torch==" in run:
                installs += 1
                assert '--index-url "$TORCH_INDEX_URL"' in run, run
                assert args.get("TORCH_INDEX_URL") == "https://pypi.org/simple"
    assert installs == 1


@pytest.mark.parametrize("name", BUILT)
def test_a_stage_that_fetches_tokenizers_has_torch(name):
    """scripts/fetch_tokenizers.py converts GGUF tokenizers through transformers' GGUF reader, which imports torch."""
    for stage in _stages(_dockerfile(name)):
        runs = [args for word, args in stage if word == "RUN"]
        fetch = [i for i, r in enumerate(runs) if "fetch_tokenizers.py" in r]
        if fetch:
            torch = [i for i, r in enumerate(runs) if "torch==" in r]
            assert torch and torch[0] < fetch[0], f"{name}: a stage fetches the tokenizers without torch"


def test_tokenizer_align_image_has_no_torch():
    final = _stages(_dockerfile("tokenizer_align"))[-1]
    assert not [r for word, r in final if word == "RUN" and "torch" in r]
    assert ("COPY", "--from=tokenizers /opt/mrl/tokenizers /opt/mrl/tokenizers") in final


@pytest.mark.parametrize("name", BUILT)
def test_dockerfile_exposes_published_ports(name):
    exposed = {int(p.split("/")[0]) for word, args in _instructions(_dockerfile(name)) if word == "EXPOSE"
               for p in args.split()}
    assert {container for _, container in _ports(name)} <= exposed


@pytest.mark.parametrize("name", BUILT)
def test_each_built_service_is_a_package(name):
    assert (_service_dir(name) / "pyproject.toml").is_file()


@pytest.mark.parametrize("name", MRL_SERVICES)
def test_command_is_a_known_mrl_subcommand(name):
    command = SERVICES[name]["command"]
    assert command[0] == "mrl"
    group, action = command[1], command[2]
    assert _cli_accepts(group, action), f"`mrl {group} {action}` is not a command of the installed packages"


def test_cli_accepts_exchange_serve():
    assert _cli_accepts("exchange", "serve")
    assert not _cli_accepts("exchange", "no-such-action")


def test_published_ports_unique():
    hosts = [host for name in SERVICES for host, _ in _ports(name)]
    assert len(hosts) == len(set(hosts)), f"a host port is published twice: {sorted(hosts)}"


@pytest.mark.parametrize("name", [n for n in MRL_SERVICES if "MRL_PORT" in _env(n)])
def test_published_ports_are_the_configured_ones(name):
    env = _env(name)
    configured = {int(env["MRL_PORT"]), int(env["MRL_ADMIN_PORT"])}
    assert {container for _, container in _ports(name)} == configured


@pytest.mark.parametrize("name", sorted(REDIS_USERS | {n for n in MRL_SERVICES if "MRL_REDIS_URL" in _env(n)}))
def test_redis_url_points_at_the_redis_service(name):
    url = urlparse(_env(name).get("MRL_REDIS_URL", ""))
    assert url.scheme == "redis" and url.hostname == "redis" and url.port in (None, 6379), url.geturl()
    assert SERVICES[name]["depends_on"]["redis"]["condition"] == "service_healthy"


@pytest.mark.parametrize("name", [n for n in MRL_SERVICES if "MRL_HOST" in _env(n)])
def test_servers_binding_beyond_loopback_have_auth(name):
    env = _env(name)
    # with no auth file the servers force loopback, which a published port cannot reach
    assert not is_loopback(env["MRL_HOST"]) and env.get("MRL_AUTH_FILE")


def _mounted_host_path(name: str, container_path: str) -> tuple[pathlib.Path, str]:
    for source, target, mode in _binds(name):
        if container_path == target or container_path.startswith(target.rstrip("/") + "/"):
            assert source.startswith((".", "/")), f"{name}: {target} should be a bind mount of a repo file"
            return (ROOT / source / pathlib.PurePosixPath(container_path).relative_to(target)).resolve(), mode
    raise AssertionError(f"{name}: nothing is mounted at {container_path}")


@pytest.mark.parametrize("name", [n for n in MRL_SERVICES if "MRL_AUTH_FILE" in _env(n)])
def test_auth_file_is_mounted_and_valid(name):
    path, mode = _mounted_host_path(name, _env(name)["MRL_AUTH_FILE"])
    assert path.is_file() and mode == "ro"
    auth = Authenticator.from_file(path)
    assert auth.enabled
    principals = yaml.safe_load(path.read_text())["principals"]
    assert sorted((p["name"], p["role"]) for p in principals) == [
        ("admin", "admin"), ("policy-a", "policy"), ("policy-b", "policy")]
    # the example-only tokens printed in its comments are the ones whose hashes it holds
    tokens = dict(re.findall(r"^#\s+(\S+)\s+\(example only\):\s+(\S+)$", path.read_text(), re.M))
    assert {auth.authenticate(f"Bearer {token}").name: n for n, token in tokens.items()} == {
        "policy-a": "policy-a", "policy-b": "policy-b", "admin": "admin"}


@pytest.mark.parametrize("name", ["trainer-a", "trainer-b"])
def test_trainer_config_comes_from_read_only_examples(name):
    command = SERVICES[name]["command"]
    config = command[3]                                     # mrl trainer run CONFIG [--set KEY=VALUE ...]
    assert command[:3] == ["mrl", "trainer", "run"] and all(
        command[i] == "--set" and "=" in command[i + 1] for i in range(4, len(command), 2))
    assert config.startswith("/etc/mrl/") and config.endswith(f"{name.removeprefix('trainer-')}.yaml")
    path, mode = _mounted_host_path(name, config)
    assert mode == "ro" and path.parent == ROOT / "examples"
    assert SERVICES[name]["depends_on"]["exchange"]["condition"] == "service_healthy"


@pytest.mark.parametrize("name", ["trainer-a", "trainer-b"])
def test_trainer_configs_validate_and_point_at_the_compose_services(name):
    """The mounted config, with the compose command's --set overrides, is a valid trainer config whose
    exchange, THL and scheduler addresses are compose service names."""
    config = _trainer_config(name)
    targets = [config.exchange.target, config.sharing.align.target, config.scheduler.target]
    assert [t.split(":")[0] for t in targets] == ["exchange", "tokenizer_align", "scheduler"]
    assert config.sharing.mode != "none" and config.sharing.peers


@pytest.mark.parametrize("name", ["trainer-a", "trainer-b"])
def test_example_trainer_configs_hold_no_token_or_compose_address_and_compose_gives_them(name, monkeypatch):
    """The example config a local run reads names no token and no compose service (a local run would send the one
    and fail to resolve the other): compose passes the addresses as --set and the token as MRL_TOKEN, which
    authenticates as the trainer's policy with the compose auth file, for every service."""
    from mrl_trainer.app import parse_overrides
    from mrl_trainer.config import load_config
    command = SERVICES[name]["command"]
    path = ROOT / "examples" / pathlib.Path(command[3]).name
    text = path.read_text()
    assert "token:" not in text and not re.search(r"\b(exchange|tokenizer_align|scheduler):5005\d", text)
    monkeypatch.setenv("MRL_TOKEN", _env(name)["MRL_TOKEN"])
    config = load_config(path, parse_overrides([_interpolated(v) for v in command[5::2]]))
    auth = Authenticator.from_file(_mounted_host_path("exchange", _env("exchange")["MRL_AUTH_FILE"])[0])
    for key in ("exchange.token", "sharing.align.token", "scheduler.token"):
        assert config.source(key) == "MRL_TOKEN"
    assert auth.authenticate(f"Bearer {config.exchange.token}").policy == config.policy


@pytest.mark.parametrize("name", [n for n in MRL_SERVICES if not n.startswith("trainer-")])
def test_every_service_has_a_health_check_the_trainers_wait_for(name):
    check = " ".join(SERVICES[name]["healthcheck"]["test"])
    assert f"http://127.0.0.1:{_env(name)['MRL_ADMIN_PORT']}/readyz" in check
    for trainer in ("trainer-a", "trainer-b"):
        assert SERVICES[trainer]["depends_on"][name]["condition"] == "service_healthy"


def _trainer_config(name: str):
    from mrl_trainer.app import parse_overrides
    from mrl_trainer.config import load_config
    command = SERVICES[name]["command"]
    return load_config(ROOT / "examples" / pathlib.Path(command[3]).name,
                       parse_overrides([_interpolated(v) for v in command[5::2]]))


@pytest.mark.parametrize("name", ["trainer-a", "trainer-b"])
def test_trainer_logs_one_line_per_step(name):
    """A progress bar writes carriage returns only, which `docker compose logs` never shows as lines: neither the
    trainer's nor transformers' (tqdm's own switch turns those off)."""
    assert _trainer_config(name).metrics.progress is False
    assert _env(name).get("TQDM_DISABLE") == "1"


@pytest.mark.parametrize("name", ["trainer-a", "trainer-b"])
def test_trainer_state_lives_in_named_volumes(name):
    """Checkpoints, metrics and outbox (under checkpoint.dir) and the model cache (converted GGUFs, warm starts)
    survive `docker compose down`: each under a named volume, checkpoint.dir per run id."""
    config = _trainer_config(name)
    volumes = {target: source for source, target, _ in _binds(name) if source in (COMPOSE.get("volumes") or {})}
    home = "/home/mrl"      # the image's user (services/trainer/Dockerfile)
    for path in (config.checkpoint.dir, f"{home}/.cache/mrl/models"):
        assert any(path.startswith(target.rstrip("/") + "/") or path == target for target in volumes), (
            f"{name}: {path} is not on a named volume ({volumes})")
    assert config.metrics.jsonl is None, "metrics.jsonl defaults to <checkpoint.dir>/metrics.jsonl"
    assert config.run_id == "compose" and f"/{config.run_id}/" in config.checkpoint.dir + "/"
    command = " ".join(SERVICES[name]["command"])
    assert "run_id=${MRL_RUN_ID:-compose}" in command and "${MRL_RUN_ID:-compose}/" in command
    assert re.search(r"install -d -o mrl -g mrl [^&]*/home/mrl/\.mrl", (ROOT / "services/trainer/Dockerfile").read_text())


def test_compose_runs_the_pair_of_the_demo():
    """The trainers of examples/mutual.yaml (config, sharing mode, coupling) are the compose trainers."""
    from mrl_trainer.config import load_config
    demo = yaml.safe_load((ROOT / "examples/mutual.yaml").read_text())
    pair = []
    for trainer in demo["trainers"]:
        config = load_config(ROOT / "examples" / trainer["config"], trainer.get("set") or {})
        pair.append((pathlib.Path(trainer["config"]).name, config.sharing.mode, config.sharing.coupling))
    compose = []
    for name in ("trainer-a", "trainer-b"):
        config = _trainer_config(name)
        compose.append((pathlib.Path(SERVICES[name]["command"][3]).name, config.sharing.mode, config.sharing.coupling))
    assert sorted(compose) == sorted(pair)


def test_depends_on_names_services():
    for name, svc in SERVICES.items():
        for dep in svc.get("depends_on") or {}:
            assert dep in SERVICES and dep != name, f"{name} depends on {dep!r}"
