"""The wire format does not depend on whether orjson (the ``fast`` extra) is installed: a
client with it and a server without it (or the other way round) read each other's frames, and
refuse the same bad bodies."""

from __future__ import annotations

import struct

import pytest

from dbqueue.lockserver import protocol

MESSAGES = [
    {"op": "hello", "protocol": protocol.PROTOCOL, "version": 1, "client": "host:1234 Zoë"},
    {"op": "acquire", "id": 7, "names": [f"jobs:job:{i}" for i in range(10)], "owner": "9:1:2"},
    {"taken": [True, False, True], "id": 7},
    {"op": "wake", "queue": "日本"},
    {"error": 'bad "request"\n', "id": None},
]
BAD_BODIES = [b"not json", b"[]", b'"\xff"', b"{", b"", b"\xff\xfe{}"]


@pytest.fixture(params=["orjson", "json"])
def codec(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "json":
        monkeypatch.setattr(protocol, "_DUMPS", protocol._dumps)
        monkeypatch.setattr(protocol, "_LOADS", protocol._loads)
    return request.param


def test_orjson_is_installed_in_development() -> None:
    """The dev install has the ``fast`` extra, so the tests here compare both codecs."""
    assert protocol.orjson is not None and protocol._DUMPS is protocol.orjson.dumps


@pytest.mark.parametrize("message", MESSAGES)
def test_either_codec_reads_the_others_frames(codec: str, message: dict) -> None:
    frame = protocol.encode(message)
    length = protocol.frame_length(frame)
    assert length == len(frame) - protocol.HEADER.size
    assert protocol.decode(frame[protocol.HEADER.size :]) == message
    for other in (protocol._dumps(message), protocol.orjson.dumps(message)):
        assert protocol.decode(other) == message
        assert list(protocol.take_frames(bytearray(struct.pack("!I", len(other)) + other))) == [
            message
        ]


@pytest.mark.parametrize("body", BAD_BODIES)
def test_both_codecs_refuse_the_same_bodies(codec: str, body: bytes) -> None:
    with pytest.raises(protocol.ProtocolError):
        protocol.decode(body)


def test_a_message_that_is_not_json_is_a_protocol_error(codec: str) -> None:
    with pytest.raises(protocol.ProtocolError, match="cannot be written as JSON"):
        protocol.encode({"op": "acquire", "names": {1, 2}})
    with pytest.raises(protocol.ProtocolError, match="exceeds"):
        protocol.encode({"op": "acquire", "names": ["x" * protocol.MAX_FRAME_BYTES]})
