"""SMS segment counts against the published rules (GSM 03.38 / 3GPP TS 23.040, as Twilio's
character-limit guide states them): 160 GSM-7 septets single, 153 per concatenated part;
70 UCS-2 code units single, 67 per part; extension characters count double; one character
outside GSM-7 makes the whole message UCS-2; an emoji is a surrogate pair (two units)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from postlane import InvalidMessage, Message
from postlane.core.message import Delivery
from postlane.core.sms import (
    GSM7,
    GSM7_EXTENSION,
    UCS2,
    count_segments,
    fallback_key,
    is_gsm7,
    sms_fallback,
    sms_message,
)
from postlane.core.states import State
from postlane.core.validation import validate
from postlane.providers.sms import SandboxSmsProvider


@pytest.mark.parametrize(("text", "encoding", "segments", "units"), [
    ("", GSM7, 1, 0),
    ("a" * 160, GSM7, 1, 160),
    ("a" * 161, GSM7, 2, 161),
    ("a" * 306, GSM7, 2, 306),  # 2 x 153
    ("a" * 307, GSM7, 3, 307),
    ("a" * 459, GSM7, 3, 459),  # 3 x 153
    ("a" * 460, GSM7, 4, 460),
    ("€" * 80, GSM7, 1, 160),  # each extension character is two septets
    ("€" * 80 + "a", GSM7, 2, 161),
    ("{" * 81, GSM7, 2, 162),
    ("a" * 159 + "^", GSM7, 2, 161),
    ("Grüße aus Köln, Ärger mit Æsir? ¿Señor? §5 @ £3 ¥1", GSM7, 1, 50),
    ("Hello 😀", UCS2, 1, 8),  # the emoji is a surrogate pair: 2 units
    ("ж" * 70, UCS2, 1, 70),
    ("ж" * 71, UCS2, 2, 71),
    ("ж" * 134, UCS2, 2, 134),  # 2 x 67
    ("ж" * 135, UCS2, 3, 135),
    ("😀" * 35, UCS2, 1, 70),
    ("a" * 69 + "ç", UCS2, 1, 70),  # lower-case c-cedilla is not in GSM-7 (only Ç is)
    ("a" * 70 + "ç", UCS2, 2, 71),
])
def test_published_examples(text: str, encoding: str, segments: int, units: int) -> None:
    result = count_segments(text)
    assert (result.encoding, result.segments, result.units) == (encoding, segments, units)
    assert sum(result.parts) == units
    assert len(result.parts) == segments


def test_per_part_capacity_of_concatenated_messages() -> None:
    gsm = count_segments("a" * 400)
    assert gsm.per_segment == 153 and gsm.parts == (153, 153, 94)
    ucs = count_segments("ж" * 150)
    assert ucs.per_segment == 67 and ucs.parts == (67, 67, 16)
    assert count_segments("a" * 160).per_segment == 160
    assert count_segments("ж" * 70).per_segment == 70


def test_an_escape_pair_is_never_split_across_segments() -> None:
    # 152 septets, then "€" (2) would make 154 > 153: it moves whole to the second part.
    result = count_segments("a" * 152 + "€" + "a" * 10)
    assert result.encoding == GSM7 and result.units == 164
    assert result.parts == (152, 12)


def test_a_surrogate_pair_is_never_split_across_segments() -> None:
    result = count_segments("ж" * 66 + "😀" + "ж" * 10)
    assert result.encoding == UCS2 and result.units == 78
    assert result.parts == (66, 12)
    emoji = count_segments("😀" * 36)  # 72 units: 33 emoji (66 units) fit in a part of 67
    assert emoji.parts == (66, 6)


def test_every_extension_character_counts_double() -> None:
    assert set("^{}\\[~]|€\f") == set(GSM7_EXTENSION)
    for char in GSM7_EXTENSION:
        assert count_segments(char).units == 2, repr(char)
        assert count_segments(char * 80).segments == 1
        assert count_segments(char * 81).segments == 2


def test_one_character_outside_gsm7_makes_the_whole_text_ucs2() -> None:
    assert is_gsm7("Your code is 1234")
    assert not is_gsm7("Your code is 1234 ✓")
    assert count_segments("a" * 100).segments == 1
    assert count_segments("a" * 100 + "✓").segments == 2  # 101 UCS-2 units > 70


def test_sms_message_records_segments_and_encoding_in_metadata() -> None:
    message = sms_message(key="otp:42", to="+4915112345678", text="€" * 81,
                          metadata={"user": 7})
    assert message.channel == "sms"
    assert message.metadata == {"user": 7,
                                "sms": {"encoding": GSM7, "segments": 2, "units": 162}}
    validate(message)


def test_sms_message_refuses_too_many_segments_and_validation_checks_e164() -> None:
    with pytest.raises(InvalidMessage, match="11 GSM-7 segments"):
        sms_message(key="k", to="+4915112345678", text="a" * (153 * 10 + 1))
    with pytest.raises(InvalidMessage, match=r"E\.164"):
        validate(sms_message(key="k", to="015112345678", text="hi"))


def test_the_fallback_is_a_delivery_of_its_own_with_a_derived_key() -> None:
    original = Message(key="reset:tok-9", to="ada@example.com", subject="Reset",
                       text="link", lane="interactive", import_id="imp-1",
                       expires_in=timedelta(minutes=15))
    fallback = sms_fallback(original, to="+14155550100", text="Your reset code: 123456")
    assert fallback.key == fallback_key(original.key) == "sms-fallback:reset:tok-9"
    assert (fallback.channel, fallback.to, fallback.lane) == ("sms", "+14155550100",
                                                              "interactive")
    assert fallback.import_id == "imp-1"
    assert fallback.expires_in == timedelta(minutes=15)  # not useful past the original's
    assert fallback.metadata["fallback_of"] == "reset:tok-9"
    assert fallback.metadata["sms"] == {"encoding": GSM7, "segments": 1, "units": 23}
    validate(fallback)


def _delivery(message: Message, id_: int) -> Delivery:
    from datetime import UTC, datetime

    now = datetime.now(UTC)
    return Delivery(
        id=id_, key=message.key, lane=message.lane, channel=message.channel,
        recipient=message.to, sender=None, subject=message.subject, text=message.text,
        html=None, headers={}, metadata=dict(message.metadata), import_id=None,
        template_id=None, template_version=None, state=State.SENDING, attempts=0, claims=1,
        run_at=now, expires_at=None, lease_owner="w", lease_expires_at=now,
        attempt_started_at=now, provider_message_id=None, dead_reason=None, last_error=None,
        created_at=now, updated_at=now, sent_at=None, finished_at=None,
    )


async def test_sandbox_sms_provider_records_sends_and_segments() -> None:
    provider = SandboxSmsProvider()
    long = _delivery(sms_message(key="a", to="+14155550100", text="ж" * 71), 1)
    short = _delivery(sms_message(key="b", to="+14155550101", text="hi {there}"), 2)
    first = await provider.send(long)
    assert first.kind == "accepted"
    assert (await provider.send(short)).kind == "accepted"
    again = await provider.send(long)  # a retry with the same key: deduplicated
    assert again.provider_message_id == first.provider_message_id
    assert [(r.key, r.segments, r.encoding) for r in provider.sent] == [
        ("a", 2, UCS2), ("b", 1, GSM7)]
    assert provider.segments_billed == 3
    assert provider.duplicates_suppressed == 1
    assert (await provider.lookup("a")) is not None and await provider.lookup("zz") is None
    email = _delivery(Message(key="e", to="x@example.com", subject="s", text="t"), 3)
    assert (await provider.send(email)).kind == "permanent"


def test_the_python_examples_of_the_sms_page_run() -> None:
    import re
    from pathlib import Path

    page = Path(__file__).parents[2] / "docs" / "sms.md"
    blocks = re.findall(r"```python\n(.*?)```", page.read_text(encoding="utf-8"), re.S)
    assert len(blocks) == 2
    for block in blocks:
        exec(compile(block, str(page), "exec"), {})  # each asserts what the page says
