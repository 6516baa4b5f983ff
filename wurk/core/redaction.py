"""Secrets kept out of everything wurk prints, logs or raises.

The one home for redaction: every message that quotes a Redis URL, a
metrics URL or a setting's value goes through here, so a password typed
into ``REDIS_URL`` never reaches a terminal, a log line or a traceback.

Duties:
1. :func:`redact_url`: a URL with the password of its userinfo, and any
   password-like query parameter, replaced by ``***``. It works on
   malformed URLs too (a bad scheme, an unencoded ``/`` or ``@`` in the
   password), because those are exactly the ones error messages quote.
2. :func:`redact_text`: every URL inside free text redacted, for messages
   (such as a library's exception text) that may quote one.
3. :func:`shown`: how a setting's value appears in an error message: the
   value of a secret key as ``***``, URLs redacted, anything else as its
   ``repr``.
"""

from __future__ import annotations

import re
from typing import Any

MASK = "***"
# Keys whose value is a secret as a whole (sentinel_password, a typo of it...).
_SECRET_KEY = re.compile(r"pass|secret|token|credential", re.IGNORECASE)
# Keys whose value is a URL, or addresses, that may carry credentials.
URL_KEYS = frozenset({"redis_url", "metrics_url", "sentinels"})
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")
_URL_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://\S+")
# Sentence punctuation that ends a URL quoted in text ("... to URL: Error 111").
_TRAILING = re.compile(r"[:,.;)\]'\"]+$")
# ?password=..., &ssl_password=..., ;auth_token=... up to the next separator.
_SECRET_PARAM = re.compile(r"([?&;][^=&;#]*(?:pass|secret|token|auth)[^=&;#]*=)[^&;#]*",
                           re.IGNORECASE)


def redact_url(url: str) -> str:
    """``redis://user:pw@host/0?password=x`` -> ``redis://user:***@host/0?password=***``.

    Userinfo is everything up to the last ``@``, so a password holding an
    unencoded ``/``, ``?`` or ``@`` is still masked whole; userinfo without
    a ``:`` may be a password typed without one and is masked as a whole.
    """
    text = _SECRET_PARAM.sub(rf"\g<1>{MASK}", url)
    scheme = _SCHEME.match(text)
    head = scheme.group() if scheme else ""
    rest = text[len(head):]
    at = rest.rfind("@")
    if at < 0:
        return text
    user, colon, _ = rest[:at].partition(":")
    userinfo = f"{user}:{MASK}" if colon else MASK
    return f"{head}{userinfo}@{rest[at + 1:]}"


def redact_text(text: str) -> str:
    """``text`` with every ``scheme://...`` token in it redacted."""
    return _URL_IN_TEXT.sub(_redact_token, text)


def _redact_token(match: re.Match[str]) -> str:
    # The punctuation after a quoted URL is the sentence's, not the password's:
    # keep it outside the mask so the message still reads.
    token = match.group()
    tail = _TRAILING.search(token)
    end = tail.start() if tail else len(token)
    return redact_url(token[:end]) + token[end:]


def is_secret_key(key: str) -> bool:
    return bool(_SECRET_KEY.search(key))


def shown(key: str, value: Any, *, unknown: bool = False) -> str:
    """``value`` as an error message may quote it for setting ``key``.

    ``unknown`` marks a key that is not a setting (a typo): its value may be
    anything, a mistyped URL included, so strings in it are redacted too.
    """
    if value is not None and is_secret_key(key):
        return MASK
    if key in URL_KEYS or unknown:
        return repr(_redacted(value))
    return repr(value)


def _redacted(value: Any) -> Any:
    if isinstance(value, str):
        return redact_url(value)
    if isinstance(value, list | tuple):
        return type(value)(_redacted(v) for v in value)
    if isinstance(value, dict):
        return {k: MASK if is_secret_key(str(k)) else _redacted(v) for k, v in value.items()}
    return value
