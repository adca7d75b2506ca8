"""Atheris (libFuzzer) harness for the frame decoder: Protobuf and JSON codecs, compression, ServerConnection.

Run for a bounded time (CI does 15 s through tests/test_fuzz.py::test_atheris_harness_bounded)::

    python tests/fuzz/fuzz_decoder.py -max_total_time=60 [-seed_corpus_dir=DIR] [CORPUS_DIR ...]

``--write-seeds DIR`` writes a seed corpus (valid frames of every message kind, compressed every
way) and exits. A crash is any exception other than RemoteProtocolError out of the decoder, or a
violated property of tests/fuzz/checks.py; libFuzzer writes the input to ``crash-<sha1>``: turn it
into a regression test in tests/test_fuzz.py.

The first input byte (mod 5) picks the target: 0 the rest is a binary frame for ProtoCodec.decode;
1 a text frame for JsonCodec.decode (invalid UTF-8 becomes lone surrogates); 2 a compressed payload
of codec 1-3; 3 and 4 a sequence of frames and events for a ServerConnection (proto, JSON).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import atheris

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the `fuzz` package
sys.path.insert(1, str(Path(__file__).resolve().parents[2]))  # the repository: lowlat_mw

with atheris.instrument_imports(include=["lowlat_mw", "fuzz"]):
    from fuzz.checks import JSON, PROTO, SUBPROTOCOLS, check_connection, check_frame
    from lowlat_mw.errors import ErrorCode
    from lowlat_mw.protocol import events as ev
    from lowlat_mw.protocol.compression import compress
    from lowlat_mw.protocol.wire import to_json_dict


def _frames(fdp: atheris.FuzzedDataProvider, text: bool) -> list[tuple[str, object]]:
    steps: list[tuple[str, object]] = []
    while fdp.remaining_bytes() and len(steps) < 16:
        kind = fdp.ConsumeIntInRange(0, 7)
        if kind <= 4:
            size = fdp.ConsumeIntInRange(0, 512)
            steps.append(("frame", fdp.ConsumeUnicode(size) if text else fdp.ConsumeBytes(size)))
        elif kind == 5:
            steps.append(("tick", fdp.ConsumeFloatInRange(0.0, 60.0)))
        elif kind == 6:
            steps.append(("chunk", (fdp.ConsumeIntInRange(0, 7), fdp.ConsumeUnicode(fdp.ConsumeIntInRange(0, 64)))))
        else:
            steps.append(("finish", fdp.ConsumeIntInRange(0, 7)))
    return steps


def test_one_input(data: bytes) -> None:
    if not data:
        return
    target, rest = data[0] % 5, data[1:]
    if target == 0:
        check_frame(PROTO, rest)
    elif target == 1:
        # surrogateescape: undecodable bytes become lone surrogates, which JSON escapes (\ud800) can produce too
        check_frame(JSON, rest.decode("utf-8", "surrogateescape"))
    elif target == 2:
        codec_id = 1 + (rest[0] % 3 if rest else 0)
        check_frame(PROTO, bytes([0x10 | codec_id]) + rest[1:])
    else:
        check_connection(SUBPROTOCOLS[target - 3], _frames(atheris.FuzzedDataProvider(rest), text=target == 4))


def seeds() -> list[bytes]:
    """Valid inputs for every target: the fuzzer mutates from these."""
    events = [
        ev.Hello(client="c", compression=("zstd", "lz4", "snappy"), resume_token="s.t", last_seq={1: 2}, auth="tok"),
        ev.Request(stream_id=1, model="m", text="hello " * 40, params={"n": 3, "x": [1.5, None, {"y": True}]}),
        ev.Request(stream_id=2, data=bytes(range(256))),
        ev.Request(stream_id=3, messages=(ev.ChatMessage(role="user", content="h\u00e9 \U0001f600"),)),
        ev.Delta(stream_id=1, seq=1, text="tok"), ev.End(stream_id=1, last_seq=1, timings_ms={"total": 1.5}),
        ev.Error(stream_id=1, code=ErrorCode.MODEL_ERROR, message="m"),
        ev.Cancel(stream_id=1), ev.Ping(id=7), ev.Pong(id=7), ev.Ack(stream_id=1, seq=1, done=True),
        ev.GoAway(reason="bye", reconnect_after_ms=10),
    ]
    out: list[bytes] = []
    for event in events:
        frame = PROTO.encode(event)
        out.append(b"\x00" + frame)
        out.append(b"\x01" + JSON.encode(event).encode("utf-8"))
        out.append(b"\x01" + json.dumps(to_json_dict(event)).encode("ascii"))  # \uXXXX escapes
        for codec_id, name in ((1, "zstd"), (2, "lz4"), (3, "snappy")):
            out.append(b"\x02" + bytes([codec_id - 1]) + compress(name, frame[1:]))
    return out


def write_seeds(directory: Path) -> int:
    directory.mkdir(parents=True, exist_ok=True)
    seeds_ = seeds()
    for i, seed in enumerate(seeds_):
        (directory / f"seed-{i:03d}").write_bytes(seed)
    return len(seeds_)


def main(argv: list[str]) -> None:
    if argv[1:2] == ["--write-seeds"]:
        print(f"wrote {write_seeds(Path(argv[2]))} seeds to {argv[2]}")
        return
    atheris.Setup(argv, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main(sys.argv)
