"""The kernel's validators say what is wrong in the same words as the panel's (protocol.ts)."""

import json
from pathlib import Path

import pytest

from phalanx.events import SchemaError, validate_event, validate_request

SHARED = Path(__file__).parents[1] / "labextension" / "test" / "fixtures" / "messages.json"


@pytest.mark.parametrize("case", json.loads(SHARED.read_text())["errors"], ids=lambda c: c["says"])
def test_an_error_names_the_message_the_field_and_what_was_expected(case):
    with pytest.raises(SchemaError) as info:
        if "event" in case:
            validate_event(case["event"])
        else:
            validate_request(case["request"])
    assert str(info.value) == case["says"]


def test_an_unknown_type_lists_the_known_ones():
    with pytest.raises(SchemaError, match="unknown request type 'exec'; known: profile_next, "):
        validate_request({"v": 1, "type": "exec", "code": "import os"})
