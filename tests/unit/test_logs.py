"""Log lines as a pipeline reads them: JSON per line, send fields, addresses and secrets
redacted, the HTTP libraries' per-request lines kept out of INFO."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from datetime import timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from postlane.core.validation import mask_address, redact_addresses
from postlane.errors import ConfigurationError
from postlane.logs import (
    QUIET_LOGGERS,
    JsonFormatter,
    TextFormatter,
    configure_logging,
    log_effective_configuration,
    redact_setting,
)


def record(msg: str, *args: object, level: int = logging.INFO, **extra: object
           ) -> logging.LogRecord:
    rec = logging.LogRecord("postlane.worker", level, __file__, 1, msg, args, None)
    for name, value in extra.items():
        setattr(rec, name, value)
    return rec


def test_a_json_line_has_time_level_logger_message_and_the_send_fields() -> None:
    line = JsonFormatter().format(record("delivery %d sent", 42, delivery_id=42,
                                         provider_message_id="pm-1", lane="interactive"))
    data = json.loads(line)
    assert "\n" not in line
    assert data["level"] == "INFO" and data["logger"] == "postlane.worker"
    assert data["message"] == "delivery 42 sent"
    assert data["delivery_id"] == 42 and data["provider_message_id"] == "pm-1"
    assert data["time"].endswith("+00:00")


def test_a_delivery_line_without_extra_still_carries_its_id() -> None:
    data = json.loads(JsonFormatter().format(record("delivery %d: %s", 7, "ambiguous")))
    assert data["delivery_id"] == 7
    alert = record("ALERT dead letter: delivery %d (%s, lane %s, to %s) reason=%s", 41,
                   "reset:1", "interactive", "a***@example.com", "permanent")
    assert json.loads(JsonFormatter().format(alert))["delivery_id"] == 41
    after = record("%s: 100%% done, delivery %d", "import", 9)
    assert json.loads(JsonFormatter().format(after))["delivery_id"] == 9
    assert "delivery_id" not in json.loads(JsonFormatter().format(record("worker started")))


def test_addresses_are_redacted_in_both_formats() -> None:
    rec = record("delivery %d is ambiguous (to %s): 550 <%s> unknown", 3,
                 "alice@example.com", "bob.smith@example.org")
    for formatter in (JsonFormatter(), TextFormatter()):
        line = formatter.format(rec)
        assert "alice@" not in line and "bob.smith@" not in line
        assert "a***@example.com" in line and "b***@example.org" in line


def test_an_exception_stays_on_its_line() -> None:
    try:
        raise ValueError("to carol@example.com")
    except ValueError:
        import sys

        rec = logging.LogRecord("postlane.api", logging.ERROR, __file__, 1, "failed", (),
                                sys.exc_info())
    line = JsonFormatter().format(rec)
    assert "\n" not in line and "carol@" not in line
    assert "ValueError" in json.loads(line)["exception"]


@pytest.mark.parametrize(("name", "value", "shown"), [
    ("db", "postgresql://app:s3cret@db:5432/mail", "postgresql://app:***@db:5432/mail"),
    ("provider", "resend://api.resend.com?api_key=re_123&from=a%40b.c",
     "resend://api.resend.com?api_key=***&from=a%40b.c"),
    ("limiter", "redis://:hunter2@redis:6379/0", "redis://:***@redis:6379/0"),
    ("webhook_secret", "whsec_abc", "***"),
    ("rate", "200/s", "200/s"),
    ("db", "sqlite:///relative.db", "sqlite:///relative.db"),
    ("lease", timedelta(seconds=30), "30s"),
    ("concurrency", 200, 200),
    ("drain", False, False),
    ("provider", None, None),
])
def test_settings_are_logged_without_their_secrets(name: str, value: object,
                                                   shown: object) -> None:
    assert redact_setting(name, value) == shown


@pytest.fixture
def root_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    quiet = {name: logging.getLogger(name).level for name in QUIET_LOGGERS}
    yield
    for handler in list(root.handlers):
        root.removeHandler(handler)
    for handler in handlers:
        root.addHandler(handler)
    root.setLevel(level)
    for name, old in quiet.items():
        logging.getLogger(name).setLevel(old)


@pytest.mark.usefixtures("root_logging")
def test_http_clients_per_request_lines_stay_out_of_info() -> None:
    configure_logging("INFO", "json")
    for name in ("httpx", "httpcore", "botocore", "urllib3"):
        assert not logging.getLogger(name).isEnabledFor(logging.INFO)
        assert logging.getLogger(name).isEnabledFor(logging.WARNING)
    assert logging.getLogger("postlane.worker").isEnabledFor(logging.INFO)
    configure_logging("DEBUG", "text")
    assert logging.getLogger("httpx").isEnabledFor(logging.DEBUG)


@pytest.mark.usefixtures("root_logging")
def test_the_effective_configuration_is_one_redacted_line(
        capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging("INFO", "json")
    log_effective_configuration(logging.getLogger("postlane.worker"), "worker", {
        "db": "postgresql://app:s3cret@db/mail", "rate": "200/s", "burst": 1})
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and "s3cret" not in lines[0]
    data = json.loads(lines[0])
    assert data["configuration"] == {"db": "postgresql://app:***@db/mail", "rate": "200/s",
                                     "burst": 1}


def test_unknown_format_or_level_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="xml"):
        configure_logging("INFO", "xml")
    with pytest.raises(ConfigurationError, match="'LOUD'"):
        configure_logging("LOUD", "text")


addresses = st.emails()


@given(addresses)
def test_a_masked_address_hides_the_local_part_and_is_stable(address: str) -> None:
    local = address.rpartition("@")[0]
    masked = mask_address(address)
    assert masked == mask_address(address)
    assert masked.split(" #")[0].endswith("@" + address.rpartition("@")[2])
    if len(local) > 4:
        assert local not in masked


def test_masks_tell_similar_addresses_apart() -> None:
    first, second = mask_address("alice.smith@example.com"), mask_address("alice.smyth@example.com")
    assert first != second
    assert first.startswith("al***@example.com #") and second.startswith("al***@example.com #")


def test_addresses_inside_text_are_redacted() -> None:
    assert redact_addresses("550 5.1.1 <dave@example.com>: unknown, to=erin@example.org") \
        == "550 5.1.1 <d***@example.com>: unknown, to=e***@example.org"
    assert redact_addresses('"GET /v1/deliveries?recipient=frank%40example.com&x=1 HTTP/1.1"') \
        == '"GET /v1/deliveries?recipient=f***@example.com&x=1 HTTP/1.1"'
