"""The docs stand alone and stay true: a short README, no reference to files outside the repository,
links that resolve, and a configuration reference that is what the settings models say now."""
import re
import subprocess

from helpers import ROOT, load_script

# the design notes kept outside the repository: spelled in two parts so this file does not cite them itself
OUTSIDE_DESIGN = "DESIGN" + ".md"
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def _tracked(*patterns: str) -> list:
    out = subprocess.run(["git", "ls-files", *patterns], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return [ROOT / line for line in out.splitlines() if (ROOT / line).is_file()]


def test_readme_is_short():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines; reference material belongs in docs/"


def test_nothing_cites_a_design_file_users_do_not_have():
    cited = [str(p.relative_to(ROOT)) for p in _tracked() if p.suffix in (".py", ".proto", ".md", ".txt", ".yaml",
                                                                        ".yml", ".toml", "")
             and OUTSIDE_DESIGN in p.read_text(errors="ignore")]
    assert not cited, f"these cite {OUTSIDE_DESIGN}, which is not in the repository: {cited}"


def test_relative_links_in_the_docs_resolve():
    broken = []
    for page in _tracked("README.md", "docs/*.md", "docs/**/*.md", "services/*/README.md"):
        for target in LINK.findall(page.read_text()):
            if "://" in target or target.startswith("mailto:"):
                continue
            if not (page.parent / target).exists():
                broken.append(f"{page.relative_to(ROOT)} → {target}")
    assert not broken, f"broken links: {broken}"


def test_configuration_reference_is_fresh():
    fresh = load_script("gen_config_docs").render()
    committed = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    assert committed == fresh, "docs/configuration.md is stale: run `make docs` and commit it"
