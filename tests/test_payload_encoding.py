"""The canonical payload text (stored, hashed, compared by ``find_equivalent``) must not depend
on whether orjson (the ``fast`` extra) is installed: every payload gets the very text, hash and
error that the json module's encoder gives it."""

from __future__ import annotations

import dataclasses
import datetime as dt
import decimal
import enum
import json
import math
import random
import struct
import uuid
from collections import OrderedDict, namedtuple
from typing import Any

import pytest

from dbqueue.base import payload as payload_codec
from dbqueue.errors import PayloadError

#: The encoder as it was before orjson: the reference every path must match.
REFERENCE = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
)


def reference(value: Any) -> tuple[str, str | None]:
    """(canonical text, exception type) by the reference encoder."""
    try:
        return REFERENCE.encode(value), None
    except (TypeError, ValueError) as exc:
        return "", type(exc).__name__


def fast(value: Any) -> tuple[str, str | None]:
    try:
        return payload_codec.canonical_text(value), None
    except (TypeError, ValueError) as exc:
        return "", type(exc).__name__


class Colour(enum.Enum):
    RED = 1


class Name(str, enum.Enum):
    ADA = "ada"


class Level(enum.IntEnum):
    HIGH = 3


class Text(str):
    pass


class Number(int):
    pass


class Mapping(dict):  # type: ignore[type-arg]
    pass


@dataclasses.dataclass
class Point:
    x: int


Pair = namedtuple("Pair", "a b")


def _floats(rng: random.Random) -> list[float]:
    found = [0.0, -0.0, 1.0, 0.1, 1 / 3, 1e-4, 1e-5, 1.5e-5, 1e-7, 1e15, 1e16, 1e17, 1e22]
    found += [5e-324, 2.2250738585072014e-308, 1.7976931348623157e308, 123456789012345678.0]
    for _ in range(3000):
        found.append(struct.unpack("d", rng.getrandbits(64).to_bytes(8, "little"))[0])
        found.append(rng.choice((-1, 1)) * 10 ** rng.uniform(-30, 30))
        found.append(round(rng.uniform(-1e6, 1e6), rng.randint(0, 8)))
    for exponent in range(-320, 309, 7):
        found.append(float(f"1.5e{exponent}"))
    return [f for f in found if math.isfinite(f)]


def _text(rng: random.Random) -> str:
    pools = (
        "abc xyz",
        '"\\/\b\f\n\r\t',
        "".join(map(chr, range(32))) + "\x7f\x80\x9f\u2028\u2029\ufeff",
        "Zoë ação ñ 日本語 Ω ﬀ",
        "😀𝄞\U0010ffff",
        "e-mail 1e+5 0.00001",
    )
    pool = rng.choice(pools)
    return "".join(rng.choice(pool) for _ in range(rng.randint(0, 12)))


def _value(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.randrange(9 if depth < 4 else 6)
    if kind == 0:
        return rng.choice((None, True, False))
    if kind == 1:
        return rng.choice((0, -1, 2**31, -(2**63), 2**63 - 1, 2**63, 2**64 - 1, 2**64, 10**30))
    if kind == 2:
        return rng.randint(-(10**6), 10**6)
    if kind == 3:
        return rng.choice(_FLOATS)
    if kind in (4, 5):
        return _text(rng)
    if kind == 6:
        return [_value(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    if kind == 7:
        return tuple(_value(rng, depth + 1) for _ in range(rng.randint(0, 3)))
    return {_text(rng): _value(rng, depth + 1) for _ in range(rng.randint(0, 5))}


_FLOATS = _floats(random.Random(7))


def test_every_float_is_written_as_json_writes_it() -> None:
    mismatched = [f for f in _FLOATS if fast(f) != reference(f)]
    assert mismatched == []
    assert fast({"f": _FLOATS}) == reference({"f": _FLOATS})


def test_every_code_point_is_written_as_json_writes_it() -> None:
    text = "".join(chr(c) for c in range(0x110000) if not 0xD800 <= c < 0xE000)
    assert fast(text) == reference(text)
    assert fast({text: [text]}) == reference({text: [text]})


def test_random_nested_payloads_match_the_json_module() -> None:
    rng = random.Random(19)
    for _ in range(20_000):
        value = _value(rng)
        assert fast(value) == reference(value), value


@pytest.mark.parametrize(
    "value",
    [
        {"b": 1, "a": 2, "é": 3, "ﬀ": 4, "😀": 5, "Z": 6, "": 7, "a\x00": 8},
        OrderedDict([("z", 1), ("a", 2)]),
        {"deep": [[[[[[[[[[{"x": [1, 2.5, "e-1"]}]]]]]]]]]]},
        [[]] * 300,
        {"k" * 1000: "v" * 100_000},
        # Values json refuses, or writes unlike orjson: the same text or the same refusal.
        float("nan"),
        [float("inf")],
        {"x": -float("inf")},
        {1: "int key"},
        {True: 1, None: 2},
        {(1, 2): "tuple key"},
        uuid.UUID(int=1),
        Colour.RED,
        Name.ADA,
        Level.HIGH,
        Text("sub"),
        {Text("k"): Number(5)},
        Mapping(a=1),
        Pair(1, 2),
        Point(1),
        dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc),
        dt.date(2026, 1, 1),
        decimal.Decimal("1.5"),
        b"bytes",
        {1, 2},
        "\ud800 lone surrogate",
        1e-05,
        [10**400],
    ],
    ids=repr,
)
def test_edge_cases_match_the_json_module(value: Any) -> None:
    assert fast(value) == reference(value)


def test_deep_and_cyclic_payloads_match() -> None:
    deep: Any = 1
    for _ in range(400):  # deeper than orjson's limit, within json's
        deep = [deep]
    assert fast(deep) == reference(deep)
    cyclic: list[Any] = []
    cyclic.append(cyclic)
    assert fast(cyclic) == reference(cyclic)


def test_stored_text_and_hash_do_not_depend_on_orjson(monkeypatch: pytest.MonkeyPatch) -> None:
    """``encode`` and ``payload_hash`` (what is stored and compared) with orjson and with the
    pure-Python fallback (orjson absent) give the same text, hash and errors."""
    rng = random.Random(23)
    values = [_value(rng) for _ in range(3000)] + [{"order": 42}, None, "x", 1.5e-5]
    with_orjson = [_encoded(v) for v in values]
    monkeypatch.setattr(payload_codec, "_DUMPS", None)
    assert [_encoded(v) for v in values] == with_orjson


def test_orjson_is_installed_in_development() -> None:
    """The dev install has the ``fast`` extra, so the tests above compare both paths."""
    assert payload_codec._DUMPS is not None


def _encoded(value: Any) -> tuple[str, str] | str:
    try:
        text = payload_codec.encode(value)
    except PayloadError as exc:
        return str(exc)
    return str(text), payload_codec.payload_hash(text)


def test_common_payloads_take_the_fast_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """The comparisons above would pass if orjson's text were never used: here json is
    unavailable, and ordinary payloads are still encoded."""

    class Unavailable:
        def encode(self, value: Any) -> str:
            raise AssertionError(f"fell back to json for {value!r}")

    monkeypatch.setattr(payload_codec, "_CANONICAL", Unavailable())
    for value in ({"n": 1}, {"order": 42, "name": "Zoë", "tags": ["a", "b"]}, [1, None, True], 2.5):
        assert payload_codec.canonical_text(value) == reference(value)[0]


def _encoded_and_hashed(value: Any, max_bytes: int | None) -> tuple[Any, ...] | str:
    try:
        text, digest = payload_codec.encode_and_hash(value, max_bytes)
    except PayloadError as exc:
        return str(exc)
    return type(text), str(text), digest


def _expected(value: Any, max_bytes: int | None) -> tuple[Any, ...] | str:
    try:
        text = payload_codec.encode(value, max_bytes)
    except PayloadError as exc:
        return str(exc)
    return type(text), str(text), payload_codec.payload_hash(text)


def test_encode_and_hash_is_encode_then_hash(monkeypatch: pytest.MonkeyPatch) -> None:
    """The bulk enqueue's one-step encoding (which hashes orjson's bytes) stores the text and
    hash, or raises the error, that ``encode`` then ``payload_hash`` give: flat dicts (with
    non-ASCII text and at the size limit), nested and random payloads, what orjson writes
    differently or refuses, and text already encoded; with orjson and without it."""
    rng = random.Random(29)
    flat = [{"n": i, "s": "Zoë 日本 \U0001f600", "ok": True, "none": None} for i in range(50)]
    values = flat + [_value(rng) for _ in range(1000)] + [{"f": 1.5e-5}, {1: 2}, {"x": {1, 2}}]
    values.append(payload_codec.EncodedPayload('"already encoded"'))  # passed through, as encode
    size = len(payload_codec.encode(flat[0]).encode())
    for limit in (None, size, size - 1):  # the limit counts UTF-8 bytes, not code points
        assert [_encoded_and_hashed(v, limit) for v in values] == [
            _expected(v, limit) for v in values
        ]
    monkeypatch.setattr(payload_codec, "_DUMPS", None)
    assert [_encoded_and_hashed(v, None) for v in values] == [_expected(v, None) for v in values]
