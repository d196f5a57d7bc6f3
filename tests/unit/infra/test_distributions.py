"""Our distributions: one version, printed by ``longrunctl --version`` and every service's ``--version``;
``make dist``'s builds of the runtime, the client and the example kinds, each with its licence and
metadata, passing ``twine check``."""

from __future__ import annotations

import subprocess
import sys
import tomllib
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest
from click.testing import CliRunner
from packaging.requirements import Requirement

import longrun
import longrun_client
from longrun_client import ctl

ROOT = Path(__file__).resolve().parents[3]
SERVICES = ("gateway", "scheduler", "worker", "timer", "reconciler", "outbox_relay")
DISTRIBUTIONS = {"longrun-runtime": ROOT, "longrun-client": ROOT / "clients/python",
                 "longrun-example-dependency-upgrade": ROOT / "examples/dependency_upgrade",
                 "longrun-example-research-agent": ROOT / "examples/research_agent"}


@pytest.mark.packaging
def test_longrunctl_and_every_service_print_the_one_version() -> None:
    version = longrun.__version__
    assert longrun_client.__version__ == version
    assert CliRunner().invoke(ctl.main, ["--version"]).output == f"longrunctl {version}\n"
    for name in SERVICES:
        done = subprocess.run([sys.executable, "-m", f"longrun.services.{name}", "--version"], capture_output=True,
                              text=True, timeout=60, cwd=ROOT)
        assert (done.returncode, done.stdout) == (0, f"longrun-{name.replace('_', '-')} {version}\n"), done.stderr


def test_the_runtime_takes_its_version_from_the_code_and_the_client_of_its_release() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "longrun.__version__"}
    client = next(Requirement(r) for r in project["project"]["dependencies"] if r.startswith("longrun-client"))
    assert client.specifier.contains(longrun_client.__version__) and not client.specifier.contains("1.0")


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    for source in DISTRIBUTIONS.values():
        subprocess.run([sys.executable, "-m", "build", "--outdir", str(out), str(source)], check=True,
                       capture_output=True, timeout=300)
    return out


@pytest.mark.packaging
def test_every_distribution_builds_with_its_licence_and_passes_twine_check(built: Path) -> None:
    wheels = {w.name.split("-")[0]: w for w in built.glob("*.whl")}
    assert set(wheels) == {name.replace("-", "_") for name in DISTRIBUTIONS}
    assert len(list(built.glob("*.tar.gz"))) == len(DISTRIBUTIONS)
    checked = subprocess.run([sys.executable, "-m", "twine", "check", "--strict", *map(str, built.iterdir())],
                             capture_output=True, text=True, timeout=120)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    for wheel in wheels.values():
        with zipfile.ZipFile(wheel) as archive:
            names = archive.namelist()
            meta = Parser().parsestr(archive.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode())
        assert meta["License-Expression"] == "Apache-2.0", wheel.name
        assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names), wheel.name
    with zipfile.ZipFile(wheels["longrun_runtime"]) as archive:
        meta = Parser().parsestr(archive.read(f"longrun_runtime-{longrun.__version__}.dist-info/METADATA").decode())
    assert meta["Version"] == longrun.__version__
    assert "longrun-client<0.2,>=0.1" in meta.get_all("Requires-Dist")


def _index_versions(name: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pip", "index", "versions", name], capture_output=True, text=True,
                          timeout=120)


@pytest.mark.packaging
def test_no_distribution_of_ours_has_a_name_taken_on_the_package_index() -> None:
    ours = [*DISTRIBUTIONS, *(tomllib.loads(p.read_text())["project"]["name"]
                              for p in (ROOT / "tests/integration/fixtures").glob("*/pyproject.toml"))]
    assert len(ours) == 6 and all(name.startswith("longrun-") for name in ours)
    # The check can fail: the name the runtime first had belongs to someone else's project there.
    taken = _index_versions("longrun")
    if taken.returncode != 0:
        pytest.skip(f"the package index does not answer here: {taken.stderr.strip()[-200:]}")
    assert "Available versions" in taken.stdout
    for name in ours:
        answer = _index_versions(name)
        assert answer.returncode != 0 and "No matching distribution found" in answer.stderr, (name, answer.stdout)


@pytest.mark.packaging
def test_each_wheel_installs_only_its_own_top_level_package(built: Path) -> None:
    owners = {"longrun_runtime": {"longrun"}, "longrun_client": {"longrun_client"},
              "longrun_example_dependency_upgrade": {"longrun_dependency_upgrade"},
              "longrun_example_research_agent": {"longrun_research_agent"}}
    for wheel in built.glob("*.whl"):
        with zipfile.ZipFile(wheel) as archive:
            names = archive.namelist()
        tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith((".dist-info", ".data"))}
        assert tops == owners[wheel.name.split("-")[0]], wheel.name
        if wheel.name.startswith("longrun_runtime"):
            # The services ship inside the runtime's package, runnable and with the console's pages.
            assert {f"longrun/services/{name}/__main__.py" for name in SERVICES} <= set(names)
            assert "longrun/services/gateway/templates/console/base.html" in names


def test_the_code_reaches_the_services_only_as_longrun_services() -> None:
    # services/ is also importable as `services` from a checkout; a module imported under both names
    # would run twice (two metric registries, two settings), so nothing may use the short name.
    stray = []
    for top in ("shared", "services", "tests", "bench", "examples", "clients"):
        for path in (ROOT / top).rglob("*.py"):
            if "node_modules" in path.parts:
                continue
            for number, line in enumerate(path.read_text().splitlines(), 1):
                words = line.split()
                if words[:1] in (["import"], ["from"]) and len(words) > 1 and \
                        words[1].split(".")[0] == "services":
                    stray.append(f"{path.relative_to(ROOT)}:{number}")
    assert not stray
