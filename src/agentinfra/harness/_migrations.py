"""Compatibility readers for what older agentinfra versions wrote; every one lives here, each with a test.

- ``run.json``'s spec, schema 1 -> 2 (`run_spec`): the generic ``grader`` settings
  (which only kernels read) become the environment's own ``settings``; a spec
  without ``environment`` was a kernels run; a ``seed`` (never used) is dropped from any spec.
- ``recording.json`` without ``environment`` (`recording_environment`): a kernels recording.
- A stored evaluation of schema 1 (`read_evaluation`): a kernel verdict (``speedup``,
  no ``score``), read as a schema-2 `Evaluation`.

Each reader takes what was parsed from the file and returns the current shape;
what is already current passes through unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agentinfra.environments import EVALUATION_SCHEMA_VERSION, Evaluation, Finding, Outcome

__all__ = ["LEGACY_ENVIRONMENT", "read_evaluation", "recording_environment", "run_spec"]

LEGACY_ENVIRONMENT = "kernels"
"""The environment of records written when kernels was the only one, and so the default."""
_LEGACY_SCORE_UNIT = "speedup"
_VERDICT_V1_KEYS = frozenset(
    {
        "schema_version",
        "outcome",
        "correct",
        "speedup",
        "speedup_ci",
        "findings",
        "provenance",
        "error",
    }
)


def run_spec(data: Any) -> Any:
    """A run spec of schema 1 (as every run.json of then has it) in the schema-2 shape; anything else unchanged.

    A ``seed`` (written before it was dropped, never used) is dropped from any spec.
    Schema 1 held the kernel grader's settings as ``grader`` for every environment
    (the desktop ignored them): a kernels run keeps them as its ``settings``, any
    other environment's settings start from its model's defaults.
    """
    if isinstance(data, dict) and "seed" in data:
        data = {k: v for k, v in data.items() if k != "seed"}
    if not isinstance(data, dict) or data.get("schema_version") != 1:
        return data
    old = {k: v for k, v in data.items() if k not in ("grader", "schema_version")}
    environment = str(data.get("environment", LEGACY_ENVIRONMENT))
    grader = data.get("grader", {})
    settings = (
        dict(grader) if environment == LEGACY_ENVIRONMENT and isinstance(grader, dict) else {}
    )
    return {**old, "schema_version": 2, "environment": environment, "settings": settings}


def recording_environment(data: Mapping[str, Any]) -> str:
    """The environment a recording was made in (recordings without one were of kernels)."""
    return str(data.get("environment", LEGACY_ENVIRONMENT))


def read_evaluation(
    data: Mapping[str, Any], *, environment: str, score_unit: str = ""
) -> Evaluation:
    """A stored evaluation of run ``environment``; a schema-1 kernel verdict is converted.

    Raises:
        ValueError: not an evaluation (pydantic's `ValidationError` included).
    """
    if data.get("schema_version") == EVALUATION_SCHEMA_VERSION:
        return Evaluation.model_validate(data)
    ci = data.get("speedup_ci")
    return Evaluation(
        environment=environment, outcome=Outcome(str(data.get("outcome", "grader_error"))),
        correct=bool(data.get("correct")), score=data.get("speedup"), score_unit=score_unit or _LEGACY_SCORE_UNIT,
        score_ci=(float(ci[0]), float(ci[1])) if isinstance(ci, (list, tuple)) and len(ci) == 2 else None,
        findings=[Finding.model_validate(f) for f in data.get("findings", [])],
        provenance=dict(data.get("provenance") or {}), error=data.get("error"),
        details={k: v for k, v in data.items() if k not in _VERDICT_V1_KEYS} | {"speedup": data.get("speedup")},
    )  # fmt: skip
