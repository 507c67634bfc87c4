"""The OpenAI text assembly the embedded backend relies on."""

from __future__ import annotations

from engines.openai_format import Detokenizer


def test_detokenizer_holds_partial_utf8_and_cuts_at_stop() -> None:
    data = "héllo STOP more".encode()
    detok = Detokenizer(lambda ids: bytes(ids).decode(errors="replace"), ["STOP"])
    out = [detok.add([b], is_last=False) for b in data[:3]]
    assert out == ["h", "", "é"]  # the 2-byte é waits for its second byte
    rest = detok.add(list(data[3:]), is_last=False)
    assert detok.text == "héllo " and rest == "llo " and detok.is_stopped
