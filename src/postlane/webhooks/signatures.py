"""Webhook signature schemes, verified before a byte of the payload is trusted.

- Standard Webhooks (the sandbox; Svix, and so Resend, uses the same scheme with ``svix-``
  headers): HMAC-SHA256 over ``id.timestamp.body``, ``v1,<base64>`` signatures, a timestamp
  tolerance against replays, and several secrets at once during a rotation.
- A shared secret (Postmark, which signs nothing and recommends HTTP basic auth in the
  webhook URL; the SMTP bounce intake): the password of ``Authorization: Basic`` (any user
  name) or a ``token`` query parameter, compared in constant time with each configured
  secret.
- Amazon SNS (SES events): RSA over a canonical string, with the certificate fetched from
  an ``https://sns.<region>.amazonaws.com/....pem`` URL in the topic's region and nowhere
  else (``sns_certificates``), from a topic on the configured allow-list only, and at most
  an hour old.

Every failure raises ``WebhookRejected`` with a specific reason (answered 401, never 500);
a genuine request whose payload cannot be read or stored raises ``WebhookMalformed`` (400).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit

from postlane.errors import PostlaneError
from postlane.extras import requires

DEFAULT_TOLERANCE_S = 300


class WebhookRejected(PostlaneError):
    """The request is not a genuine, fresh event from the provider it claims to be from."""


class WebhookMalformed(WebhookRejected):
    """The request verified (or could not be verified because it is not JSON at all) but
    its payload cannot be read or stored: not a JSON object, nested too deep, a NUL or a
    lone surrogate in a string. Sending it again cannot help."""


def _secret_key(secret: str) -> bytes:
    try:
        return base64.b64decode(secret.removeprefix("whsec_"), validate=True)
    except (binascii.Error, ValueError):
        raise WebhookRejected("webhook secret is not base64 (whsec_...)") from None


def sign_standard(secret: str, message_id: str, timestamp: int, body: bytes) -> str:
    """The ``webhook-signature`` value for a payload (used by the sandbox and by tests)."""
    signed = f"{message_id}.{timestamp}.".encode() + body
    digest = hmac.new(_secret_key(secret), signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def verify_standard(
    secrets: Sequence[str], headers: Mapping[str, str], body: bytes, *, now: float,
    prefix: str = "webhook", tolerance_s: int = DEFAULT_TOLERANCE_S,
) -> str:
    """Verify a Standard Webhooks request; returns its message id (the event id)."""
    if not secrets:
        raise WebhookRejected("no webhook secret is configured for this provider")
    lower = {k.lower(): v for k, v in headers.items()}
    values = []
    for name in ("id", "timestamp", "signature"):
        value = lower.get(f"{prefix}-{name}")
        if not value:
            raise WebhookRejected(f"missing header {prefix}-{name}")
        values.append(value)
    message_id, timestamp_text, signatures = values
    try:
        timestamp = int(timestamp_text)
    except ValueError:
        raise WebhookRejected(f"{prefix}-timestamp is not a unix time") from None
    if timestamp < now - tolerance_s:
        raise WebhookRejected("timestamp is too old (possible replay)")
    if timestamp > now + tolerance_s:
        raise WebhookRejected("timestamp is in the future")
    signed = f"{message_id}.{timestamp}.".encode() + body
    expected = [
        base64.b64encode(hmac.new(_secret_key(s), signed, hashlib.sha256).digest())
        for s in secrets
    ]
    for part in signatures.split():
        version, _, signature = part.partition(",")
        if version != "v1" or not signature:
            continue
        if any(hmac.compare_digest(signature.encode(), e) for e in expected):
            return message_id
    raise WebhookRejected("no valid signature (wrong secret, tampered body or bad format)")


# -- Amazon SNS -------------------------------------------------------------------------
SNS_CERT_HOST = re.compile(r"^sns\.([a-z]{2}(?:-[a-z]+)+-\d{1,2})\.amazonaws\.com$")
"""``sns.<region>.amazonaws.com`` and nothing else: not a subdomain, not another suffix."""
SNS_MAX_AGE_S = 3600
"""A notification older than this is refused (a replay); SNS retries within the hour."""
SNS_MAX_SKEW_S = 300
_SNS_FIELDS = {
    "Notification": ("Message", "MessageId", "Subject", "Timestamp", "TopicArn", "Type"),
    "SubscriptionConfirmation": ("Message", "MessageId", "SubscribeURL", "Timestamp", "Token",
                                 "TopicArn", "Type"),
    "UnsubscribeConfirmation": ("Message", "MessageId", "SubscribeURL", "Timestamp", "Token",
                                "TopicArn", "Type"),
}

CertFetcher = Callable[[str], Awaitable[bytes]]
"""Returns the PEM certificate at a (validated) SigningCertURL: ``SnsCertificates.get``."""


def verify_shared_secret(secrets: Sequence[str], headers: Mapping[str, str],
                         token: str | None, *, provider: str) -> None:
    """The request carries one of ``secrets`` as its basic-auth password or its ``token``
    query parameter; raises ``WebhookRejected`` otherwise (and when none is configured)."""
    if not secrets:
        raise WebhookRejected(f"no secret configured for {provider} webhooks: set "
                              f"POSTLANE_WEBHOOK_SECRET_{provider.upper()}")
    offered = []
    if token:
        offered.append(token)
    authorization = next((v for k, v in headers.items() if k.lower() == "authorization"), "")
    scheme, _, credentials = authorization.partition(" ")
    if scheme.lower() == "basic" and credentials.strip():
        try:
            decoded = base64.b64decode(credentials.strip(), validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            raise WebhookRejected("the basic-auth credentials cannot be read") from None
        offered.append(decoded.partition(":")[2])
    if not offered:
        raise WebhookRejected(f"{provider} webhook without credentials (basic auth in the "
                              "webhook URL, or ?token=)")
    if not any(hmac.compare_digest(o.encode(), s.encode()) for o in offered for s in secrets):
        raise WebhookRejected(f"{provider} webhook credentials do not match")


def sns_string_to_sign(message: Mapping[str, Any]) -> bytes:
    fields = _SNS_FIELDS.get(str(message.get("Type")))
    if fields is None:
        raise WebhookRejected(f"unknown SNS message type {message.get('Type')!r}")
    lines = []
    for name in fields:
        if name in message and message[name] is not None:
            lines += [name, str(message[name])]
    return ("\n".join(lines) + "\n").encode()


def check_cert_url(url: str) -> str:
    """Refuse any SigningCertURL but ``https://sns.<region>.amazonaws.com/....pem``;
    returns the region."""
    parts = urlsplit(url)
    match = SNS_CERT_HOST.match(parts.hostname or "")
    if (parts.scheme != "https" or match is None or parts.query or parts.fragment
            or "@" in parts.netloc or parts.netloc.lower() != parts.hostname
            or not parts.path.endswith(".pem")):
        raise WebhookRejected("SigningCertURL is not an Amazon SNS certificate URL "
                              "(https://sns.<region>.amazonaws.com/....pem)")
    return match[1]


def check_sns_topic(message: Mapping[str, Any], topics: Sequence[str]) -> str:
    """The TopicArn must be one of ``topics`` (any topic in any AWS account can sign a
    notification to this endpoint); returns its region."""
    if not topics:
        raise WebhookRejected("no SNS topic is allowed: list the SES event topics in "
                              "POSTLANE_WEBHOOK_SES_TOPICS")
    arn = str(message.get("TopicArn") or "")
    if arn not in topics:
        raise WebhookRejected(f"SNS topic {arn!r} is not in POSTLANE_WEBHOOK_SES_TOPICS")
    return arn.split(":")[3] if arn.count(":") >= 5 else ""


def check_sns_timestamp(message: Mapping[str, Any], now: float) -> None:
    text = str(message.get("Timestamp") or "")
    try:
        sent = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise WebhookRejected("SNS Timestamp is not an ISO 8601 time") from None
    if sent.tzinfo is None:
        raise WebhookRejected("SNS Timestamp has no time zone")
    age = now - sent.timestamp()
    if age > SNS_MAX_AGE_S:
        raise WebhookRejected(f"SNS notification is {int(age)} s old (over "
                              f"{SNS_MAX_AGE_S} s: possible replay)")
    if age < -SNS_MAX_SKEW_S:
        raise WebhookRejected("SNS Timestamp is in the future")


async def verify_sns(body: bytes, fetch_cert: CertFetcher, *, topics: Sequence[str],
                     now: float) -> dict[str, Any]:
    """Verify an SNS message; returns it parsed. What costs nothing is checked before the
    certificate is fetched: the topic is allowed, the message is fresh, the certificate
    URL is Amazon's (in the topic's region)."""
    with requires("server", "verifying SES (SNS) webhook signatures"):
        from cryptography import x509
        from cryptography.exceptions import InvalidSignature
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.asymmetric import padding, rsa

    try:
        message = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise WebhookRejected("body is not JSON") from None
    except RecursionError:
        raise WebhookMalformed("body is JSON nested too deep to read") from None
    if not isinstance(message, dict):
        raise WebhookRejected("body is not an SNS message")
    for name in ("Signature", "SigningCertURL", "SignatureVersion", "Type", "MessageId",
                 "TopicArn", "Timestamp"):
        if not message.get(name):
            raise WebhookRejected(f"SNS message lacks {name}")
    topic_region = check_sns_topic(message, topics)
    check_sns_timestamp(message, now)
    if check_cert_url(str(message["SigningCertURL"])) != topic_region:
        raise WebhookRejected("SigningCertURL is not in the topic's region")
    algorithm: hashes.HashAlgorithm
    if message["SignatureVersion"] == "1":
        algorithm = hashes.SHA1()
    elif message["SignatureVersion"] == "2":
        algorithm = hashes.SHA256()
    else:
        raise WebhookRejected("unknown SNS SignatureVersion")
    try:
        signature = base64.b64decode(str(message["Signature"]), validate=True)
    except (binascii.Error, ValueError):
        raise WebhookRejected("malformed SNS signature") from None
    pem = await fetch_cert(str(message["SigningCertURL"]))
    try:
        cert = x509.load_pem_x509_certificate(pem)
    except ValueError:
        raise WebhookRejected("malformed SNS certificate") from None
    key = cert.public_key()
    if not isinstance(key, rsa.RSAPublicKey):
        raise WebhookRejected("SNS certificate does not hold an RSA key")
    try:
        key.verify(signature, sns_string_to_sign(message), padding.PKCS1v15(), algorithm)
    except InvalidSignature:
        raise WebhookRejected("SNS signature does not match") from None
    return message
