"""``longrun.author`` is the one module an author imports from: every name it exports exists, is
documented, and importing it does not load the engine's worker or the testing kit."""

from __future__ import annotations

import inspect
import re
import subprocess
import sys
from pathlib import Path

import longrun.author

ROOT = Path(__file__).resolve().parents[3]
AUTHORING = (ROOT / "docs" / "authoring.md").read_text()


def test_every_exported_name_exists_and_is_documented() -> None:
    undocumented = []
    for name in longrun.author.__all__:
        value = getattr(longrun.author, name)
        own_doc = (inspect.isclass(value) or inspect.isfunction(value)) and inspect.getdoc(value)
        if not own_doc and f"`{name}" not in AUTHORING and f"{name}(" not in AUTHORING:
            undocumented.append(name)
    assert undocumented == []


def test_an_unknown_name_is_an_attribute_error() -> None:
    try:
        longrun.author.Kitt  # noqa: B018
    except AttributeError as e:
        assert "Kitt" in str(e)
    else:
        raise AssertionError("longrun.author.Kitt resolved")


def test_importing_it_loads_neither_the_worker_nor_the_kit() -> None:
    loaded = subprocess.run([sys.executable, "-c", "import sys, longrun.author; print(' '.join(sys.modules))"],
                            capture_output=True, text=True, check=True).stdout.split()
    assert not [m for m in loaded if re.match(r"longrun\.(testing|app)\b", m)]


def test_the_code_first_chapter_runs_as_written() -> None:
    chapter = AUTHORING.split("## Code-first run kinds", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", chapter, re.DOTALL)
    assert len(blocks) == 2
    namespace: dict[str, object] = {"__name__": "authoring_code_first"}
    exec(compile("\n".join(blocks), "docs/authoring.md", "exec"), namespace)
    tests = [value for name, value in namespace.items() if name.startswith("test_") and callable(value)]
    assert tests
    for test in tests:
        test()  # type: ignore[operator]
