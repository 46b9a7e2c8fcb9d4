"""The one redaction rule (``weightprep.redact``) on its own: what it masks, what it keeps, on URLs written alone, in
messages, in records, and secrets echoed without their URL; and the command line's redacting streams."""

from __future__ import annotations

import io
import string

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from weightprep import redact as r
from weightprep.commands._output import RedactingStream, redacting_streams


@pytest.fixture(autouse=True)
def _forget_secrets():
    """Each test starts with no secret remembered (the set is process-wide)."""
    saved = set(r._KNOWN)
    r._KNOWN.clear()
    yield
    r._KNOWN.clear()
    r._KNOWN.update(saved)


@pytest.mark.parametrize(("text", "expected"), [
    ("https://bob:pw12@host/x.jsonl", "https://***@host/x.jsonl"),
    ("s3://KEY:SECRET@bucket/a/b.jsonl", "s3://***@bucket/a/b.jsonl"),
    ("https://tok9@host/x", "https://***@host/x"),  # a token as the user name alone
    ("https://h/x.jsonl?X-Amz-Signature=abc&X-Amz-Credential=def", "https://h/x.jsonl?X-Amz-Signature=***&X-Amz-Credential=***"),
    ("https://h/x?bare", "https://h/x?***"),
    ("https://h/x#access_token=abc", "https://h/x#access_token=***"),
    ("https://h/x?a=1#b=2", "https://h/x?a=***#b=***"),
    ("error: https://u:p@h/x.jsonl: not found", "error: https://***@h/x.jsonl: not found"),  # the message's colon
    ("(see https://h/x?sig=abc).", "(see https://h/x?sig=***)."),
    ("s3://bucket/shards", "s3://bucket/shards"),  # nothing to hide: unchanged
    ("memory://out/shards/state.json", "memory://out/shards/state.json"),
    ("/local/path:3: field", "/local/path:3: field"),
    ("a@b.c plain email", "a@b.c plain email"),  # not a URL
    ("'https://u:p@h/x' and \"s3://k:s@b/y\"", "'https://***@h/x' and \"s3://***@b/y\""),
    ("https://u:p@h/x https://h/y?t=1", "https://***@h/x https://h/y?t=***"),
    ("https://h/x?a=1&&b=2", "https://h/x?a=***&&b=***"),  # an empty parameter stays as it was
    ("file:///data/u@host/x.jsonl", "file:///data/u@host/x.jsonl"),  # an empty authority: the @ is the path's
])
def test_what_is_masked_and_what_is_kept(text, expected):
    assert r.redact(text) == expected


_part = st.text(string.ascii_letters + string.digits + "-._~%!$'()*+,;", min_size=4, max_size=20)


@given(user=_part, password=_part, host=st.from_regex(r"[a-z][a-z0-9]{0,10}(\.[a-z]{2,5})?", fullmatch=True),
       path=st.lists(st.from_regex(r"[A-Za-z0-9_.-]{1,12}", fullmatch=True), max_size=4),
       query=st.lists(st.tuples(st.from_regex(r"[A-Za-z-]{1,10}", fullmatch=True), _part), max_size=3),
       scheme=st.sampled_from(["https", "http", "s3", "gs", "hf", "az"]))
def test_no_secret_survives_and_the_rest_is_kept(user, password, host, path, query, scheme):
    # a secret is masked wherever it appears, hosts too: the rest is kept where it holds none (user "0000",
    # password "0000", host "a0000" is "a***")
    secrets, rest = (user, password, *(v for _, v in query)), (scheme, host, *path, *(k for k, _ in query), "error: refused")
    assume(not any(s in part for s in secrets for part in rest))
    r._KNOWN.clear()  # each example on its own
    url = f"{scheme}://{user}:{password}@{host}/{'/'.join(path)}"
    if query:
        url += "?" + "&".join(f"{k}={v}" for k, v in query)
    out = r.redact(f"error: {url}: refused")
    for secret in (password, *(v for _, v in query)):
        assert secret not in out.replace(host, "").replace("/".join(path), "")
    assert out.startswith(f"error: {scheme}://***@{host}/{'/'.join(path)}") and out.endswith(": refused")
    assert [k for k, _ in query] == [p.split("=")[0] for p in out.split("?", 1)[1].split(": ")[0].split("&")] if query else True


def test_a_secret_echoed_without_its_url_is_masked_once_seen():
    message = 'Invalid bucket name "AKIAKEY:S3cretValue@bucket"'
    assert "S3cretValue" in r.redact(message)  # never seen: nothing tells it from text
    r.remember("s3://AKIAKEY:S3cretValue@bucket/x.jsonl")
    assert r.redact(message) == 'Invalid bucket name "***@bucket"'
    r.redact("https://h/x?token=QueryValue9")  # masking a URL remembers its secrets too
    assert r.redact("the server said QueryValue9") == "the server said ***"


def test_secrets_from_four_characters_and_base64_values_are_remembered_whole():
    r.redact("https://h/x?token=abcd&sig=ab==cd")
    assert r.redact("abcd ab==cd abc") == "*** *** abc"  # four characters and more; "ab==cd" whole, padding and all


def test_storage_options_secrets_are_remembered_by_key():
    r.remember_options({"key": "AccessKey1", "endpoint_url": "http://127.0.0.1:9000", "s3": {"secret": "Inner22",
                        "client_kwargs": {"region_name": "eu-west-1"}}, "token": "tk"})  # fmt: skip
    text = "AccessKey1 Inner22 http://127.0.0.1:9000 eu-west-1 tk"
    assert r.redact(text) == "*** *** http://127.0.0.1:9000 eu-west-1 tk"  # "tk": too short to mask anywhere


def test_redact_record_walks_every_string():
    record = {"inputs": [{"path": "https://u:p@h/a.jsonl", "lines": 3}], "n": 1.5, "ok": True, "none": None,
              "sources": [{"paths": ("s3://k:s@b/x",)}]}
    assert r.redact_record(record) == {"inputs": [{"path": "https://***@h/a.jsonl", "lines": 3}], "n": 1.5,
                                       "ok": True, "none": None, "sources": [{"paths": ["s3://***@b/x"]}]}


def test_the_redacting_stream_sees_a_url_written_in_pieces():
    inner = io.StringIO()
    stream = RedactingStream(inner)
    for piece in ("reading https://al", "ice:hunter22@host/x.", "jsonl\nprogress 5%\r", "tail ?sig=zz"):
        stream.write(piece)
    assert inner.getvalue() == "reading https://***@host/x.jsonl\nprogress 5%\r"  # up to the last line end
    stream.flush()
    assert inner.getvalue().endswith("tail ?sig=zz")  # no URL around it: kept
    assert "hunter22" not in inner.getvalue()
    with pytest.raises(AttributeError):
        stream.buffer  # noqa: B018 - bytes written there would pass unredacted
    assert stream.writable() == inner.writable()  # the rest is the inner stream's


def test_redacting_streams_wrap_once_and_restore(capsys):
    import sys

    before = sys.stdout, sys.stderr
    with redacting_streams():
        outer = sys.stdout
        with redacting_streams():
            assert sys.stdout is outer  # not wrapped twice
        print("https://u:pass1234@h/x")
        print("s3://k:sec5678@b/y", file=sys.stderr)
    assert (sys.stdout, sys.stderr) == before
    out, err = capsys.readouterr()
    assert out == "https://***@h/x\n" and err == "s3://***@b/y\n"
