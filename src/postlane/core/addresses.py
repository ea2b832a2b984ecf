"""International addresses (RFC 6530-6533): what enqueue accepts, what each transport sends.

An address may have a Unicode domain (a valid IDNA 2008 name, ``bücher.de``) and a Unicode
local part (RFC 6531/6532: ``atext`` and ``qtext`` extended with any UTF-8 beyond ASCII,
``почта@пример.рф``). The two travel differently:

- The **domain** always goes on the wire as A-labels (``xn--bcher-kva.de``): every transport
  carries them, the DNS needs them, and the ``Message-ID`` (built on the sender's domain)
  stays the same whatever the transport. Domains are compared without case, so ASCII and
  Unicode letters are lowered first; nothing else is mapped (no UTS 46 folding of
  ``ＡＢＣ`` into ``abc``): a name IDNA 2008 refuses is refused, not rewritten.
- A Unicode **local part** has no ASCII form (punycode is not allowed there), so it goes as
  UTF-8 where the transport carries UTF-8 (SMTP with the server's SMTPUTF8) and is refused
  with a clear error where it does not -- never mangled into encoded words.

Every refusal says what was wrong without quoting the local part: these errors end up in
outcomes, timelines and logs, where recipient addresses are not written out.
"""

from __future__ import annotations

import contextlib
import re
import unicodedata
from functools import lru_cache

from postlane.errors import InvalidAddress

# RFC 6532 section 3.2: atext and qtext extended with UTF8-non-ascii.
_ATEXT = r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~\u0080-\U0010ffff-]"
UNICODE_LOCAL = re.compile(rf"^{_ATEXT}+(?:\.{_ATEXT}+)*$")
UNICODE_QUOTED_LOCAL = re.compile(
    r'^"(?:[\x20\x21\x23-\x5b\x5d-\x7e\u0080-\U0010ffff]|\\[\x20-\x7e\u0080-\U0010ffff])*"$')
_REFUSED_CATEGORIES = {
    "Cc": "a control character", "Cf": "an invisible format character (a zero-width or "
    "direction mark)", "Cs": "a lone surrogate", "Co": "a private-use character",
    "Cn": "an unassigned code point", "Zs": "a space", "Zl": "a line separator",
    "Zp": "a paragraph separator",
}
"""Characters RFC 6532 lets through but no mailbox should hold: invisible or spoofing-prone
ones (the draft 'SMTPUTF8 address syntax' of the IETF mailmaint group refuses them too)."""


def split_address(address: str) -> tuple[str, str]:
    local, _, domain = address.rpartition("@")
    return local, domain


def unicode_local_problem(local: str) -> str | None:
    """Why a local part with non-ASCII characters is not a valid RFC 6531 one, or None."""
    if not (UNICODE_LOCAL.match(local) or UNICODE_QUOTED_LOCAL.match(local)):
        return "local part is not valid"
    for char in local:
        if char.isascii():
            continue
        why = _REFUSED_CATEGORIES.get(unicodedata.category(char))
        if why is not None:
            return f"local part contains {why} (U+{ord(char):04X})"
    if not unicodedata.is_normalized("NFC", local):
        # RFC 6532 section 3.1: addresses SHOULD be NFC; two spellings of one mailbox
        # would otherwise be two suppressions, two rate counts, two deliveries.
        return "local part is not in Unicode normalization form NFC; normalize it first"
    return None


@lru_cache(maxsize=4096)
def _alabels(domain: str) -> str:
    import idna  # its tables take ~20 ms to load: only once a domain needs them

    return idna.encode(domain.lower()).decode("ascii")


def ascii_domain(domain: str, *, field: str = "to") -> str:
    """The domain as A-labels (unchanged when it is ASCII); ``InvalidAddress`` if it is not
    a valid IDNA 2008 name."""
    if domain.isascii():
        return domain
    try:
        return _alabels(domain)
    except UnicodeError as exc:  # idna.IDNAError is one
        raise InvalidAddress(f"{field}: domain {domain!r} is not a valid internationalized "
                             f"domain name (IDNA 2008): {exc}", field=field) from None


def has_unicode_local(address: str) -> bool:
    """The address needs a transport that carries UTF-8 (SMTPUTF8): its local part is not
    ASCII."""
    return not split_address(address)[0].isascii()


def wire_address(address: str, *, field: str, utf8: bool, transport: str) -> str:
    """``address`` as a transport sends it: the domain in A-labels; a Unicode local part
    kept when ``utf8`` (the transport carries UTF-8), else refused with ``InvalidAddress``
    naming ``transport`` and why it cannot carry one."""
    local, domain = split_address(address)
    if not utf8 and not local.isascii():
        raise InvalidAddress(
            f"{field}: the local part is not ASCII (an internationalized address, RFC 6531) "
            f"and {transport}; it has no ASCII form, so nothing was sent", field=field)
    if domain.startswith("["):  # an address literal
        return address
    return f"{local}@{ascii_domain(domain, field=field)}"



def suppression_address(address: str) -> str:
    """The one spelling the suppression list keeps for an address: lowered, the domain in
    A-labels, so ``anna@bücher.de`` and ``anna@xn--bcher-kva.de`` (the form a provider's
    bounce names) are one entry. A domain that is not valid IDNA stays as given, lowered."""
    local, domain = split_address(address.lower())
    if domain.isascii() or domain.startswith("["):
        return f"{local}@{domain}" if domain else local
    try:
        return f"{local}@{_alabels(domain)}"
    except UnicodeError:
        return f"{local}@{domain}"


def address_spellings(address: str) -> list[str]:
    """The lowered spellings a recipient of ``address``'s mailbox may be stored under:
    the domain in A-labels and in Unicode (for finding deliveries, which keep the address
    as enqueued)."""
    canonical = suppression_address(address)
    local, domain = split_address(canonical)
    spellings = [canonical]
    if "xn--" in domain:
        import idna

        with contextlib.suppress(UnicodeError):
            spellings.append(f"{local}@{idna.decode(domain)}")
    return spellings
