"""A row of the ratio table, and notes its details share (for _summary and its section modules)."""

from __future__ import annotations

from typing import Any


def _row(section: str, name: str, value: float | None, target: str, met: bool | None,
         detail: str = "") -> dict[str, Any]:
    return {"section": section, "name": name, "value": value, "target": target, "met": met,
            "detail": detail}


def teardown_note(record: dict | None) -> str:
    """What a section's torchrun launches did at exit, for a row's detail ("" when all exited
    cleanly): a launch that crashed at teardown after its figure still counts (_torchrun.py).

    >>> teardown_note({"launches": 8, "crashed_at_teardown": 1})
    '; 1 of 8 torchrun launches crashed at teardown after their figure'
    >>> teardown_note({"launches": 8, "crashed_at_teardown": 0})
    ''
    """
    if not record or not record.get("crashed_at_teardown"):
        return ""
    return (f"; {record['crashed_at_teardown']} of {record['launches']} torchrun launches "
            "crashed at teardown after their figure")
