"""Bytes that are not UTF-8 in a data file (issue 12, item 14): the line is named (file:line, the
byte and its column) and is a bad row like any other, so ``on_error=skip`` skips and counts it.
Before, strict decoding raised a UnicodeDecodeError from inside the read loop: a traceback with no
file:line, and no way to skip the line."""

from __future__ import annotations

import json

import pytest

from posttrain.data.conversations import DataError, iter_jsonl, read_conversations

GOOD = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "héllo"}]}


def _write(tmp_path, bad: bytes):
    p = tmp_path / "d.jsonl"
    good = json.dumps(GOOD, ensure_ascii=False).encode("utf-8")
    # line 2: a latin-1 'é' (0xe9) at column 47; line 4: a multi-byte character cut short
    p.write_bytes(b"\n".join([good, bad, good, b'{"messages": "\xe2\x82"}', good]) + b"\n")
    return p


def test_a_line_that_is_not_utf8_is_named_with_file_line_byte_and_column(tmp_path):
    p = _write(tmp_path, b'{"messages": [{"role": "user", "content": "caf\xe9"}]}')
    with pytest.raises(DataError) as e:
        read_conversations(p)
    msg = str(e.value)
    assert f"{p}:2: not UTF-8 (byte 0xe9 at column 47)" in msg
    assert f"{p}:4: not UTF-8 (byte 0xe2 at column 15)" in msg
    assert "data.on_error=skip" in msg


def test_skip_skips_the_undecodable_lines_and_counts_them(tmp_path):
    p = _write(tmp_path, b"\xff\xfe garbage")
    rows, report = read_conversations(p, on_error="skip")
    assert rows == [GOOD, GOOD, GOOD]  # the good lines around them, with their own UTF-8 intact
    assert report.read == 5 and report.kept == 3 and [b.line for b in report.bad] == [2, 4]
    assert "3/5 rows kept, 2 bad" in report.summary() and f"{p}:2: not UTF-8 (byte 0xff at column 1)" in report.summary()


def test_iter_jsonl_raises_one_line_naming_the_line(tmp_path):
    """``iter_jsonl`` (curate's prompt reader uses it) stops at the first undecodable line."""
    p = _write(tmp_path, b"\x80")
    lines = iter_jsonl(p)
    assert next(lines)[0] == 1
    with pytest.raises(DataError, match=rf"^{p}:2: not UTF-8 \(byte 0x80 at column 1\)$"):
        next(lines)
