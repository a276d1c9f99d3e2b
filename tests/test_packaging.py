"""What a user installs and reads: the license, the wheel's contents, the container recipe,
and the documents the README points to (issue 11: packaging and docs)."""

from __future__ import annotations

import re
import subprocess
import tomllib
from fnmatch import fnmatch
from importlib.metadata import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def test_license_file_is_the_full_apache_2_text() -> None:
    text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert text.lstrip().startswith("Apache License\n                           Version 2.0")
    for section in range(1, 10):
        assert re.search(rf"^\s+{section}\. [A-Z]", text, re.M), f"section {section} missing"
    assert "END OF TERMS AND CONDITIONS" in text
    assert "APPENDIX: How to apply the Apache License to your work." in text


def test_license_is_an_spdx_expression_with_a_backend_that_reads_it() -> None:
    project = PYPROJECT["project"]
    assert project["license"] == "Apache-2.0"  # not the deprecated `{text = ...}` table
    assert project["license-files"] == ["LICENSE"]
    (requirement,) = PYPROJECT["build-system"]["requires"]
    minimum = re.fullmatch(r"setuptools>=(\d+)", requirement)
    assert minimum is not None
    assert int(minimum[1]) >= 77  # the first setuptools to take PEP 639 expressions
    assert metadata("aap-server")["License-Expression"] == "Apache-2.0"


def tracked_files(folder: str) -> list[str]:
    listed = subprocess.run(
        ["git", "ls-files", folder], cwd=ROOT, capture_output=True, text=True, check=True
    )
    return listed.stdout.split()


# A wheel holds the packages' .py files and only the data files `package-data` names: a file
# the server reads at run time and that is not named there is missing from every non-editable
# install (the shipped default policy was).
def test_every_data_file_of_the_packages_is_in_the_wheel() -> None:
    package_data: dict[str, list[str]] = PYPROJECT["tool"]["setuptools"]["package-data"]
    for package in ("aap_server", "agents"):
        patterns = package_data.get(package, [])
        for path in tracked_files(package):
            if path.endswith(".py"):
                continue
            inside = path.removeprefix(f"{package}/")
            assert any(fnmatch(inside, pattern) for pattern in patterns), (
                f"{path} is not in package-data"
            )


def test_readme_links_to_files_that_exist() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", readme)
    local = [t for t in targets if not re.match(r"[a-z]+:", t)]
    for required in ("docs/architecture.md", "LICENSE", "SECURITY.md", "CHANGELOG.md"):
        assert required in local
    for target in local:
        assert (ROOT / target).exists(), f"README links to a missing {target}"
    assert "DESIGN step table" not in readme  # DESIGN.md is not in the repository


def test_architecture_step_table_names_every_aos_method_the_runtime_sends() -> None:
    table = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    steps = (ROOT / "aap_server" / "runtime" / "steps.py").read_text(encoding="utf-8")
    from aap_server import aos

    methods = {
        request.__struct_config__.tag
        for request in aos.AosRequest.__args__
        if re.search(rf"\b{request.__name__}\b", steps)
    }
    assert methods, "no AOS request types found in runtime/steps.py"
    for method in methods:
        assert f"`{method}`" in table, f"{method} is sent by the runtime but not in the table"


def test_dockerfile_runs_unprivileged_with_a_health_check_and_a_data_volume() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text(encoding="utf-8")
    stages = re.findall(r"^FROM (\S+)", dockerfile, re.M)
    assert stages
    assert all(re.fullmatch(r"python:3\.1\d-slim(?: AS \w+)?", s) for s in stages)
    users = re.findall(r"^USER (\S+)", dockerfile, re.M)
    assert users
    assert users[-1] not in ("root", "0")
    assert re.search(r"^HEALTHCHECK .*\n?.*/health", dockerfile, re.M)
    assert re.search(r'^VOLUME \["/data"\]', dockerfile, re.M)
    assert "AAP_DB=/data/aap.db" in dockerfile
    assert 'CMD ["aap-server", "serve"]' in dockerfile  # exec form: SIGTERM reaches the server
    # Every file the build copies exists (a renamed file would break `docker build`).
    for line in re.findall(r"^COPY (?!--from)(.+) \S+$", dockerfile, re.M):
        for source in line.split():
            assert (ROOT / source).exists(), source
    compose = (ROOT / "compose.yaml").read_text(encoding="utf-8")
    assert "AAP_API_KEYS" in compose
    assert ":/data" in compose
