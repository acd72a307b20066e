"""Research stays apart from the product: no module of the SDK, the services or the launcher imports mrl_research,
no product package declares it, and the commands it registers are its own (research/pyproject.toml).

Read from the code's own imports (ast): a product module that imported research would fail here. The launcher
reaches the exchange demo (`mrl demo --exchange`) through the entry point research declares (`mrl.demos`),
never by importing it.
"""
import ast
import tomllib

from helpers import ROOT

PRODUCT = ("sdk", "services", "launcher")


def _imported(path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    names = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    names |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module
              and node.level == 0}
    names |= {node.args[0].value for node in ast.walk(tree)   # importlib.import_module("...") / __import__("...")
              if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)
              and getattr(node.func, "attr", getattr(node.func, "id", None)) in ("import_module", "__import__")}
    return names


def test_no_product_module_imports_research():
    files = [path for folder in PRODUCT for path in sorted((ROOT / folder).rglob("*.py"))
             if "egg-info" not in str(path) and "__pycache__" not in path.parts]
    assert len(files) > 50, "the product's modules were not found"
    wrong = {str(path.relative_to(ROOT)): sorted(n for n in _imported(path) if n.split(".")[0] == "mrl_research")
             for path in files}
    wrong = {path: names for path, names in wrong.items() if names}
    assert not wrong, f"product modules import research (mrl_research): {wrong}"


def test_no_product_package_declares_research():
    for path in [ROOT / "sdk" / "pyproject.toml", ROOT / "launcher" / "pyproject.toml",
                 *sorted((ROOT / "services").glob("*/pyproject.toml"))]:
        project = tomllib.loads(path.read_text())["project"]
        requires = project.get("dependencies", []) + [d for extra in project.get("optional-dependencies", {}).values()
                                                      for d in extra]
        assert not [d for d in requires if d.replace("_", "-").startswith("mrl-research")], path
        for group, points in project.get("entry-points", {}).items():
            assert not [v for v in points.values() if v.startswith("mrl_research")], (path, group)


def test_research_registers_the_bench_and_lab_commands():
    points = tomllib.loads((ROOT / "research" / "pyproject.toml").read_text())["project"]["entry-points"]
    commands = points["mrl.commands"]
    assert {name for name in commands if name.startswith("bench.")} == {
        f"bench.{n}" for n in ("exchange", "align", "scheduler", "trainer", "guard", "trl", "mutual")}
    assert {"lab.bandit", "lab.signal"} <= set(commands)
    assert all(value.startswith("mrl_research.") for value in commands.values())
    assert points["mrl.demos"] == {"exchange": "mrl_research.exchange_demo:main"}
