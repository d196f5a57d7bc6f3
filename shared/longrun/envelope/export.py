"""Write the JSON Schema of every (type, version) to schemas/ (``make schemas``).

The files are generated: a unit test regenerates them and fails on any drift.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from longrun.envelope.model import Envelope
from longrun.envelope.registry import ENVELOPES


def render() -> dict[str, str]:
    """File name -> content for every schema file."""
    files = {"envelope.schema.json": Envelope.model_json_schema()}
    for (type_, version), model in sorted(ENVELOPES.items()):
        files[f"{type_}.v{version}.schema.json"] = model.model_json_schema()
    return {name: json.dumps(schema, indent=2, sort_keys=True) + "\n" for name, schema in files.items()}


def main() -> None:
    target = Path(sys.argv[1] if len(sys.argv) > 1 else "schemas")
    target.mkdir(parents=True, exist_ok=True)
    for name, text in render().items():
        (target / name).write_text(text)


if __name__ == "__main__":
    main()
