"""The wire format between the kernel's rendezvous server and the engines' store client.

Every message is a ZeroMQ multipart message: one JSON header frame, then raw value frames (keys
and small numbers in the header, values as bytes so nothing is re-encoded).  Requests::

    {"v": 1, "id": 7, "op": "get", "keys": ["k"], "n": 0, "block_ms": 200}  [value, ...]

Replies carry the request's ``id`` and either ``"ok": true`` (with ``n`` and value frames where the
op returns something), ``"pending": true`` (a blocking op whose keys did not appear within
``block_ms``: the client asks again until its own deadline), or ``"error"``.

Only the ops in :data:`ARITY` exist; a request that does not fit its op's shape is refused before
it touches the store.  Both ends import this module, so they cannot disagree.

Example::

    >>> frames = encode_request(1, "set", ["k"], [b"v"])
    >>> decode_request(frames)
    Request(id=1, op='set', keys=['k'], values=[b'v'], n=0, block_ms=0)
"""

from __future__ import annotations

import json
from dataclasses import dataclass

VERSION = 1
MAX_KEY_BYTES = 4096
MAX_KEYS = 4096
MAX_BLOCK_MS = 2000          # a parked request never holds the server's answer longer than this
MAX_MESSAGE_BYTES = 64 << 20  # larger messages are dropped by ZeroMQ before they are read

# op -> (number of keys, number of value frames); "k" = one or more keys, "=k" = one value per key
ARITY: dict[str, tuple[int | str, int | str]] = {
    "set": (1, 1), "get": (1, 0), "add": (1, 0), "compare_set": (1, 2), "append": (1, 1),
    "delete_key": (1, 0), "num_keys": (0, 0), "check": ("k", 0), "wait": ("k", 0),
    "multi_get": ("k", 0), "multi_set": ("k", "=k"),
}
BLOCKING = frozenset({"get", "wait", "multi_get"})


class WireError(ValueError):
    """A message that does not follow this format (answered with an error, never executed)."""


@dataclass
class Request:
    id: int
    op: str
    keys: list[str]
    values: list[bytes]
    n: int = 0
    block_ms: int = 0


def encode_request(req_id: int, op: str, keys: list[str], values: list[bytes] | None = None,
                   n: int = 0, block_ms: int = 0) -> list[bytes]:
    header = {"v": VERSION, "id": req_id, "op": op, "keys": keys, "n": n, "block_ms": block_ms}
    return [json.dumps(header).encode(), *(values or [])]


def decode_request(frames: list[bytes]) -> Request:
    """The request in ``frames``, or :class:`WireError` saying what is wrong with it."""
    header = _header(frames)
    req_id, op, keys = header.get("id"), header.get("op"), header.get("keys")
    n, block_ms = header.get("n", 0), header.get("block_ms", 0)
    if not isinstance(req_id, int) or isinstance(req_id, bool):
        raise WireError("no request id")
    if not isinstance(op, str) or op not in ARITY:
        raise WireError(f"unknown op {op!r}")
    if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
        raise WireError("keys must be a list of strings")
    if not _is_int(n) or not -(1 << 63) <= n < (1 << 63):
        raise WireError("n must be a 64-bit integer")
    if not _is_int(block_ms) or not 0 <= block_ms <= MAX_BLOCK_MS:
        raise WireError(f"block_ms must be within 0..{MAX_BLOCK_MS}")
    if any(len(k.encode()) > MAX_KEY_BYTES for k in keys):
        raise WireError(f"a key is longer than {MAX_KEY_BYTES} bytes")
    values = frames[1:]
    _check_arity(op, len(keys), len(values))
    return Request(req_id, op, keys, values, n, block_ms)


def _check_arity(op: str, n_keys: int, n_values: int) -> None:
    want_keys, want_values = ARITY[op]
    if want_keys == "k":
        if not 1 <= n_keys <= MAX_KEYS:
            raise WireError(f"{op} takes 1 to {MAX_KEYS} keys, not {n_keys}")
    elif n_keys != want_keys:
        raise WireError(f"{op} takes {want_keys} key(s), not {n_keys}")
    expected = n_keys if want_values == "=k" else want_values
    if n_values != expected:
        raise WireError(f"{op} takes {expected} value(s), not {n_values}")


def encode_reply(req_id: int, *, values: list[bytes] | None = None, n: int = 0,
                 pending: bool = False, error: str | None = None) -> list[bytes]:
    header: dict = {"v": VERSION, "id": req_id, "ok": error is None and not pending, "n": n}
    if pending:
        header["pending"] = True
    if error is not None:
        header["error"] = error
    return [json.dumps(header).encode(), *(values or [])]


def decode_reply(frames: list[bytes]) -> tuple[dict, list[bytes]]:
    """(header, value frames) of a reply; :class:`WireError` if it is not one."""
    header = _header(frames)
    if not _is_int(header.get("id")) or not isinstance(header.get("ok"), bool):
        raise WireError("a reply without id or ok")
    return header, frames[1:]


def _header(frames: list[bytes]) -> dict:
    if not frames:
        raise WireError("an empty message")
    try:
        header = json.loads(frames[0])
    except (ValueError, UnicodeDecodeError) as exc:
        raise WireError(f"the header is not JSON: {exc}") from None
    if not isinstance(header, dict) or header.get("v") != VERSION:
        raise WireError(f"not a version-{VERSION} header")
    return header


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
