"""One rule for every URL that weightprep records or prints: the parts of a URL that can carry a secret are
replaced by ``***`` before the URL reaches a manifest, ``rejects.jsonl``, the HTML report, a training record, a log
line or an error message.

A URL can carry a secret in two places:

- its userinfo, ``scheme://user:password@host/...`` (fsspec's HTTP filesystem sends it as basic auth, s3fs reads
  ``s3://KEY:SECRET@bucket/...`` as credentials): the whole userinfo is replaced, user name included (a token is
  often given as the user name alone);
- its query and fragment, ``?X-Amz-Signature=...&X-Amz-Credential=...`` (presigned URLs, SAS tokens,
  ``?token=``): every value is replaced, the keys are kept (they say what kind of URL it was).

>>> redact("error: https://bob:hunter2@host/data.jsonl?X-Amz-Signature=abc&v=2: not found")
'error: https://***@host/data.jsonl?X-Amz-Signature=***&v=***: not found'

Libraries echo parts of a URL without its scheme (botocore: ``Invalid bucket name "KEY:SECRET@bucket"``), so the
secrets of every URL seen (``remember``: ``weightprep.storage`` calls it for each URL it opens, ``redact`` for each
URL it masks) and the secret-looking values of storage options (``remember_options``) are kept for this process, and
masked wherever they appear. Credentials given the other ways (the environment, profiles) are never recorded in the
first place. The rule works on any text, so it applies to a whole message as well as to one URL; ``redact_record``
applies it to every string of a JSON-like record (a manifest, a reject).
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["redact", "redact_record", "remember", "remember_options", "MASK"]

#: What replaces a secret.
MASK = "***"

#: A URL inside text: a scheme, then everything up to whitespace, a double quote, a backtick or an angle bracket (a
#: single quote may be part of a password; one that ends the URL goes back to the text, as other punctuation does).
_URL = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)(?P<rest>[^\s\"<>`]*)")

#: Secrets seen in this process (``remember``), masked wherever they appear; shorter strings are too common to mask.
_KNOWN: set[str] = set()
_SHORTEST = 4
#: Storage option keys whose string values are secrets (``key``, ``secret``, ``token``, ``sas_token``, ...).
_SECRET_KEYS = re.compile(r"key|secret|token|passw|credential|signature|sas|auth", re.IGNORECASE)

#: Punctuation that ends a sentence or a message's "URL: problem" rather than the URL.
_TRAILING = ".,:;)]}'"


def _keep(secret: str) -> None:
    if len(secret) >= _SHORTEST:
        _KNOWN.add(secret)


def _remember_params(params: str) -> None:
    for part in params.split("&"):
        _keep(part.split("=", 1)[-1])


def _mask_params(params: str) -> str:
    """``a=1&b=2`` -> ``a=***&b=***``; a parameter with no ``=`` is a value of its own."""
    out = []
    for part in params.split("&"):
        if not part:
            out.append(part)
        elif "=" in part:
            out.append(part.split("=", 1)[0] + "=" + MASK)
        else:
            out.append(MASK)
    return "&".join(out)


def _redact_url(match: re.Match[str]) -> str:
    scheme, rest = match["scheme"], match["rest"]
    trailing = rest[len(rest.rstrip(_TRAILING)) :]  # "URL: problem": the colon is the message's, not the URL's
    rest = rest[: len(rest) - len(trailing)]
    cut = min((i for i in (rest.find("/"), rest.find("?"), rest.find("#")) if i >= 0), default=len(rest))
    authority, tail = rest[:cut], rest[cut:]
    if "@" in authority:
        userinfo, host = authority.rsplit("@", 1)
        _keep(userinfo)
        for piece in userinfo.split(":"):
            _keep(piece)
        authority = MASK + "@" + host
    fragment = ""
    if "#" in tail:
        tail, fragment = tail.split("#", 1)
        _remember_params(fragment)
        fragment = "#" + _mask_params(fragment)
    if "?" in tail:
        path, query = tail.split("?", 1)
        _remember_params(query)
        tail = path + "?" + _mask_params(query)
    return scheme + authority + tail + fragment + trailing


def remember(url: str) -> None:
    """Keep the secrets of ``url`` (its userinfo, its query and fragment values) for every later ``redact``."""
    _URL.sub(_redact_url, url)


def remember_options(options: Any) -> None:
    """Keep the string values of secret-looking keys of storage options (nested per protocol)."""
    if isinstance(options, dict):
        for k, v in options.items():
            if isinstance(v, str) and _SECRET_KEYS.search(str(k)):
                _keep(v)
            else:
                remember_options(v)


def redact(text: str) -> str:
    """``text`` with the userinfo, query values and fragment values of every URL in it, and every secret seen
    before (``remember``), replaced by ``***``."""
    if "://" in text:
        text = _URL.sub(_redact_url, text)
    for secret in sorted((k for k in _KNOWN if k in text), key=len, reverse=True):
        text = text.replace(secret, MASK)
    return text


def redact_record(value: Any) -> Any:
    """``value`` (dicts, lists, strings, numbers) with every string passed through ``redact``."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {k: redact_record(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact_record(v) for v in value]
    return value
