"""deploy/k8s, checked offline: every object validates strictly against the Kubernetes JSON schemas that the
kubernetes-validate package bundles, and the manifests agree with the code: commands the services' settings
name, MRL_* variables that are settings fields and parse, readiness on /readyz and liveness on gRPC health at
the configured ports, the secrets they mount (shipped as examples, or created as docs/kubernetes.md says),
trainers requesting GPUs, with a config the trainer loads and a token of a principal of the auth file."""
import copy
import json
import pathlib
import re

import kubernetes_validate
import pytest
import yaml

from mrl.auth import Authenticator
from mrl_serving.registry import installed_services
from mrl_trainer.config import load_config

pytestmark = pytest.mark.scale

ROOT = pathlib.Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
DOCS = (ROOT / "docs" / "kubernetes.md").read_text()
KUBERNETES_VERSIONS = ("1.30.0", "1.37.0")   # the oldest and the newest release these manifests are checked for
OBJECTS = [(path.name, doc) for path in sorted(K8S.glob("*.yaml")) for doc in yaml.safe_load_all(path.read_text())
           if doc]
SERVICES = {cls.command[0]: cls for cls in installed_services().values()}   # "exchange", "align", "scheduler"


def of_kind(kind: str) -> dict[str, dict]:
    return {doc["metadata"]["name"]: doc for _, doc in OBJECTS if doc["kind"] == kind}


def workloads() -> dict[str, dict]:
    return {**of_kind("Deployment"), **of_kind("StatefulSet")}


def env_of(container: dict) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in container.get("env", [])}


def service_containers():
    """(workload name, container, its settings class) of every mrl service."""
    out = []
    for name, w in workloads().items():
        for c in w["spec"]["template"]["spec"]["containers"]:
            if c.get("command", [])[:1] == ["mrl"] and c["command"][1] in SERVICES:
                out.append((name, c, SERVICES[c["command"][1]]))
    return out


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("name, doc", OBJECTS, ids=[f"{n}:{d['kind']}:{d['metadata']['name']}" for n, d in OBJECTS])
def test_every_object_validates_against_the_kubernetes_schema(name, doc, version):
    kubernetes_validate.validate(doc, version, strict=True)


def test_the_validator_refuses_a_broken_object():
    deployment = copy.deepcopy(of_kind("Deployment")["exchange"])
    deployment["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] = "fifty"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSIONS[-1], strict=True)
    deployment = copy.deepcopy(of_kind("Deployment")["exchange"])
    deployment["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {}   # a typo: strict refuses it
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSIONS[-1], strict=True)


def test_the_three_services_redis_and_a_trainer_are_deployed():
    assert {cls.command[0] for _, _, cls in service_containers()} == set(SERVICES) == {"exchange", "align",
                                                                                        "scheduler"}
    assert "redis" in of_kind("StatefulSet") and "redis" in of_kind("Service")
    assert any(c.get("command", [])[:3] == ["mrl", "trainer", "run"] for w in workloads().values()
               for c in w["spec"]["template"]["spec"]["containers"])
    assert all(doc["metadata"].get("namespace") == "mrl" for _, doc in OBJECTS if doc["kind"] != "Namespace")


@pytest.mark.parametrize("workload, container, settings", service_containers(), ids=lambda v: getattr(v, "__name__",
                                                                                                      None))
def test_a_service_is_configured_with_its_own_settings_and_probed_where_it_listens(workload, container, settings,
                                                                                   monkeypatch):
    assert container["command"] == ["mrl", *settings.command]
    env = env_of(container)
    for name, value in env.items():
        field = name.removeprefix("MRL_").lower()
        assert field in settings.model_fields or name == "MRL_TLS_ROOT_CERT", f"{workload}: {name} is no setting"
        monkeypatch.setenv(name, value)
    parsed = settings()                                     # every value parses, from the environment as here
    assert parsed.host == "0.0.0.0" and parsed.auth_file and parsed.tls_cert and parsed.tls_key
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"grpc": parsed.port, "admin": parsed.admin_port}
    ready, alive = container["readinessProbe"], container["livenessProbe"]
    assert ready["httpGet"] == {"path": "/readyz", "port": "admin", "scheme": "HTTPS"}
    command = alive["exec"]["command"]
    service = of_kind("Service")[workload]
    assert command[:4] == ["python", "-m", "mrl_serving.probe", str(parsed.port)]
    assert command[command.index("--tls-name") + 1] == service["metadata"]["name"]   # the name the cert holds
    assert {p["name"]: p["targetPort"] for p in service["spec"]["ports"]} == {"grpc": "grpc", "admin": "admin"}
    assert service["spec"]["selector"].items() <= workloads()[workload]["spec"]["template"]["metadata"][
        "labels"].items()
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    assert str(parsed.auth_file.parent) in mounts and str(parsed.tls_cert.parent) in mounts
    if settings.needs_redis:
        assert re.fullmatch(r"redis://redis:6379/\d+", parsed.redis_url) and parsed.redis_cluster is False
    assert container["resources"]["requests"]["cpu"] and container["resources"]["limits"]["memory"]


def test_every_secret_mounted_is_shipped_or_created_as_the_docs_say():
    shipped = of_kind("Secret")
    for name, w in workloads().items():
        spec = w["spec"]["template"]["spec"]
        secrets = {v["secret"]["secretName"] for v in spec.get("volumes", []) if "secret" in v}
        secrets |= {e["valueFrom"]["secretKeyRef"]["name"] for c in spec["containers"] for e in c.get("env", [])
                    if "secretKeyRef" in e.get("valueFrom", {})}
        for secret in secrets:
            assert secret in shipped or f"create secret generic {secret}" in DOCS, f"{name} mounts {secret}"
    for key in ("tls.crt", "tls.key", "ca.crt"):                        # the keys the manifests read from mrl-tls
        assert f"--from-file={key}=" in DOCS


def test_the_trainer_requests_gpus_loads_its_config_and_holds_a_principals_token(tmp_path, monkeypatch):
    trainer = of_kind("StatefulSet")["trainer-policy-a"]
    [container] = trainer["spec"]["template"]["spec"]["containers"]
    resources = container["resources"]
    assert resources["requests"]["nvidia.com/gpu"] == resources["limits"]["nvidia.com/gpu"] >= 1
    [config_map] = of_kind("ConfigMap").values()
    [(file, text)] = config_map["data"].items()
    assert container["command"] == ["mrl", "trainer", "run", f"/etc/mrl/config/{file}"]
    (tmp_path / file).write_text(text)
    monkeypatch.setenv("MRL_TOKENIZER_CACHE", "/opt/mrl/tokenizers")   # the trainer image's (its Dockerfile)
    config = load_config(tmp_path / file)
    assert config.device == "cuda" and config.checkpoint.dir.startswith("/var/lib/mrl/")
    targets = {config.exchange.target, config.sharing.align.target, config.scheduler.target}
    services = {f"{s['metadata']['name']}:{p['port']}" for s in of_kind("Service").values() for p in s["spec"]["ports"]}
    assert targets <= services
    # the pod (a StatefulSet's pod is <name>-0) is the scheduler's node, with the GPUs the pod requests
    scheduler = env_of(of_kind("Deployment")["scheduler"]["spec"]["template"]["spec"]["containers"][0])
    node = json.loads(scheduler["MRL_NODES"])[f"{trainer['metadata']['name']}-0"]
    assert node == {**node, "kind": "cuda", "slots": resources["limits"]["nvidia.com/gpu"]}
    # its token (from a secret) is one of a principal allowed to act as this policy
    ref = next(e for e in container["env"] if e["name"] == "MRL_TOKEN")["valueFrom"]["secretKeyRef"]
    token = of_kind("Secret")[ref["name"]]["stringData"][ref["key"]]
    auth_path = tmp_path / "auth.yaml"
    auth_path.write_text(of_kind("Secret")["mrl-auth"]["stringData"]["auth.yaml"])
    principal = Authenticator.from_file(auth_path).authenticate(f"Bearer {token}")
    assert principal.policy == config.policy
