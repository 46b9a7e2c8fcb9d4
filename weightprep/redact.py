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

Credentials given the other ways (``--storage-options``, the environment, profiles) are never recorded in the
first place. The rule works on any text, so it applies to a whole message as well as to one URL; ``redact_record``
applies it to every string of a JSON-like record (a manifest, a reject).
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["redact", "redact_record", "MASK"]

#: What replaces a secret.
MASK = "***"

#: A URL inside text: a scheme, then everything up to whitespace, a quote or an angle bracket.
_URL = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)(?P<rest>[^\s'\"<>`]*)")

#: Punctuation that ends a sentence or a message's "URL: problem" rather than the URL.
_TRAILING = ".,:;)]}"


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
        authority = MASK + "@" + authority.rsplit("@", 1)[1]
    fragment = ""
    if "#" in tail:
        tail, fragment = tail.split("#", 1)
        fragment = "#" + _mask_params(fragment)
    if "?" in tail:
        path, query = tail.split("?", 1)
        tail = path + "?" + _mask_params(query)
    return scheme + authority + tail + fragment + trailing


def redact(text: str) -> str:
    """``text`` with the userinfo, query values and fragment values of every URL in it replaced by ``***``."""
    if "://" not in text:
        return text
    return _URL.sub(_redact_url, text)


def redact_record(value: Any) -> Any:
    """``value`` (dicts, lists, strings, numbers) with every string passed through ``redact``."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {k: redact_record(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact_record(v) for v in value]
    return value
