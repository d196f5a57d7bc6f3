"""Questions a run asks a person: answer schemas are JSON Schema, draft 2020-12.

The worker refuses to ask a question whose schema is not a valid draft 2020-12 schema (no answer
could be checked against it), and the operator's answer is checked against the question's schema
before anything is written (``operate.answer``). Kept out of the domain: validation needs the
``jsonschema`` library, and a run's history records answers already checked, so replaying it never
validates again.
"""

from __future__ import annotations

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from longrun.domain import FrozenMap, thaw


def schema_problem(schema: FrozenMap) -> str | None:
    """Why ``schema`` is not a draft 2020-12 JSON Schema, or None when it is."""
    try:
        Draft202012Validator.check_schema(thaw(schema))
    except SchemaError as e:
        return f"{e.json_path}: {e.message}"
    return None


def answer_problems(schema: FrozenMap, answer: object) -> list[str]:
    """Every way ``answer`` breaks ``schema``, each with the JSON path it concerns; empty when it fits."""
    errors = Draft202012Validator(thaw(schema)).iter_errors(answer)
    return [f"{e.json_path}: {e.message}" for e in sorted(errors, key=lambda e: (e.json_path, e.message))]
