"""``weightprep inspect DIR --html``: the page's content parsed and checked against the shards and the manifest,
computed independently here (row by row in Python); and the page loaded in headless Chromium when installed."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from weightprep.cli import main
from weightprep.manifest import read_manifest, read_row, split_shards
from weightprep.report.tokens import token_groups


class Page(HTMLParser):
    """Elements with their attributes and the text inside token spans."""

    def __init__(self) -> None:
        super().__init__()
        self.elements: list[tuple[str, dict[str, str]]] = []
        self.tokens: list[dict] = []  # {"attrs", "text", "row", "doc", "split"}
        self._stack: list[tuple[str, dict[str, str]]] = []
        self.text: list[str] = []
        self._ctx: dict[str, str] = {}

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.elements.append((tag, a))
        for key in ("data-split", "data-row", "data-doc"):
            if key in a and tag in ("section", "div"):
                self._ctx[key] = a[key]
        if tag == "span" and "t" in a.get("class", "").split():
            self.tokens.append({"attrs": a, "text": "", **self._ctx})
        self._stack.append((tag, a))

    def handle_endtag(self, tag):
        if self._stack:
            self._stack.pop()

    def handle_data(self, data):
        self.text.append(data)
        open_token = any(t == "span" and "t" in a.get("class", "").split() for t, a in self._stack)
        inner = self._stack[-1][1].get("class", "") if self._stack else ""
        if open_token and inner not in ("nl", "empty"):
            self.tokens[-1]["text"] += data


def parse(path: Path) -> Page:
    page = Page()
    page.feed(path.read_text(encoding="utf-8"))
    return page


@pytest.fixture(scope="module")
def built(tmp_path_factory, sample_tok):
    """A split build with rejects and a hostile text, and its report."""
    d = tmp_path_factory.mktemp("report")
    raw = d / "raw.jsonl"
    rng = np.random.default_rng(3)
    lines = []
    for i in range(60):
        pieces = [{"text": f"Q{i}: <script>alert('x')</script> & \"quotes\"\n", "weight": 0}]
        pieces.append({"text": " ".join(["word"] * int(rng.integers(1, 200))), "weight": float(rng.choice([0.5, 1, 2.5]))})
        lines.append(json.dumps({"pieces": pieces}))
    lines[5] = '{"pieces": [{"text": "x", "weight": -1}]}'
    lines[9] = "not json <b>"
    raw.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out, html = d / "shards", d / "report.html"
    args = ["build", str(raw), "--out", str(out), "--seq-len", "512", "--skip-invalid", "--validation-fraction", "0.2"]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    res = CliRunner().invoke(main, ["inspect", str(out), "--html", str(html), "--report-rows", "2"])
    assert res.exit_code == 0, res.output
    return out, html


def _rows(out: Path, manifest: dict, split: str):
    n = sum(s["rows"] for s in split_shards(manifest, split))
    return [read_row(out, manifest, i, split) for i in range(n)]


def _docs_and_pad(row: dict, pad_id: int):
    """Independently: the last segment is padding when every id is the pad and every label -100."""
    lengths = row["seq_lengths"].tolist()
    tail = lengths[-1]
    if (row["input_ids"][-tail:] == pad_id).all() and (row["labels"][-tail:] == -100).all():
        return lengths[:-1], tail
    return lengths, 0


def test_the_page_fetches_nothing_and_escapes_the_data(built):
    _, html = built
    text = html.read_text(encoding="utf-8")
    page = parse(html)
    for tag, attrs in page.elements:
        assert tag not in ("script", "link", "img", "iframe"), tag
        for key in ("src", "href"):
            assert key not in attrs, (tag, attrs)
    assert "<script>alert" not in text and "<b>" not in text
    # inside every token span, only the report's own markup (newline and empty markers) and escaped characters:
    # the hostile prompt's <, >, & and quotes are all in tokens of this build
    inner = re.findall(r'<span class="t [^"]*"[^>]*>(.*?)</span>(?=<span class="t |</div>)', text, flags=re.S)
    assert len(inner) > 100
    raw = "".join(inner).replace('<span class="nl">↵</span>', "").replace('<span class="empty">∅</span>', "")
    assert "<" not in raw and ">" not in raw
    assert re.findall(r"&(?!lt;|gt;|amp;|quot;|#x27;)", raw) == []
    assert all(c in raw for c in ("&lt;", "&gt;", "&amp;", "&quot;"))
    assert "<script>alert('x')</script>" in "".join(page.text)  # shown as text
    assert any("not json <b>" in t for t in page.text)  # the reject's original, escaped


def test_the_numbers_are_the_manifests(built):
    out, html = built
    manifest = read_manifest(out)
    page = parse(html)
    cells = {(a["data-split"], a["data-key"]): a for t, a in page.elements if "data-key" in a}
    text = html.read_text(encoding="utf-8")
    for split, counts in [("all", manifest["counts"]), *((s, manifest["splits"][s]["counts"]) for s in ("train", "validation"))]:
        for key in ("records", "documents_written", "tokens", "rows", "pad_tokens"):
            assert (split, key) in cells
            marker = f'data-split="{split}" data-key="{key}">{counts[key]:,}<'
            assert marker in text, marker
    assert manifest["counts"]["rejected"] == {"bad_weight": 1, "malformed_json": 1}
    reasons = {a["data-reason"] for t, a in page.elements if "data-reason" in a}
    assert {"rejected.bad_weight", "rejected.malformed_json"} <= reasons
    assert sum(1 for t, a in page.elements if a.get("class") == "reject") == 2


def test_histograms_equal_the_shards_counted_row_by_row(built):
    out, html = built
    manifest = read_manifest(out)
    pad = manifest["tokenizer"]["pad_used"]
    page = parse(html)
    sections: dict[str, list[list[dict]]] = {}
    current = None
    for tag, a in page.elements:
        if tag == "section":
            current = a["data-split"]
            sections[current] = []
        elif tag == "svg":
            sections[current].append([])
        elif tag == "rect" and "data-count" in a:
            sections[current][-1].append(a)
    assert set(sections) == {"train", "validation"}
    for split, charts in sections.items():
        lengths, fills, weights, pads = [], [], [], 0
        for row in _rows(out, manifest, split):
            docs, tail = _docs_and_pad(row, pad)
            lengths += docs
            fills.append((len(row["input_ids"]) - tail) / len(row["input_ids"]))
            weights += row["weights"][: len(row["input_ids"]) - tail].tolist()
            pads += tail
        counts = manifest["splits"][split]["counts"]
        assert len(lengths) == counts["documents_written"] and pads == counts["pad_tokens"]
        length_bars, weight_bars, fill_bars = charts
        edges = [float(b["data-lo"]) for b in length_bars] + [float(length_bars[-1]["data-hi"])]
        assert [int(b["data-count"]) for b in length_bars] == np.histogram(lengths, edges)[0].tolist()
        values, n = np.unique(np.asarray(weights, np.float32), return_counts=True)
        assert [float(b["data-value"]) for b in weight_bars] == values.tolist()
        assert [int(b["data-count"]) for b in weight_bars] == n.tolist()
        assert sum(n) == counts["tokens"]
        edges = [float(b["data-lo"]) for b in fill_bars] + [float(fill_bars[-1]["data-hi"])]
        assert [int(b["data-count"]) for b in fill_bars] == np.histogram(fills, edges)[0].tolist()


def test_rows_token_by_token_are_the_shard_rows(built, sample_tok):
    out, html = built
    manifest = read_manifest(out)
    pad = manifest["tokenizer"]["pad_used"]
    page = parse(html)
    for split in ("train", "validation"):
        for index in range(2):
            row = read_row(out, manifest, index, split)
            docs, tail = _docs_and_pad(row, pad)
            spans = [t for t in page.tokens if t.get("data-split") == split and t.get("data-row") == str(index)]
            ids = [int(i) for t in spans for i in t["attrs"]["data-ids"].split()]
            labels = [int(i) for t in spans for i in t["attrs"]["data-labels"].split()]
            weights = [float(i) for t in spans for i in t["attrs"]["data-weights"].split()]
            n = sum(docs)
            assert ids == row["input_ids"][:n].tolist()
            assert labels == row["labels"][:n].tolist()
            assert weights == row["weights"][:n].tolist()
            start = 0
            for k, length in enumerate(docs):
                doc_spans = [t for t in spans if t.get("data-doc") == str(k)]
                assert "".join(t["text"] for t in doc_spans) == sample_tok.decode(
                    row["input_ids"][start : start + length].tolist(), skip_special_tokens=False
                )
                for t in doc_spans:
                    w = float(t["attrs"]["data-weights"].split()[0])
                    assert f"weight {w:g}" in t["attrs"]["title"]
                start += length


def test_html_refuses_a_missing_directory(built, tmp_path):
    out, _ = built
    res = CliRunner().invoke(main, ["inspect", str(out), "--html", str(tmp_path / "no" / "r.html")])
    assert res.exit_code != 0 and "does not exist" in res.output


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=4095), min_size=1, max_size=40))
def test_token_groups_join_to_the_decoded_text(sample_tok, ids):
    groups = token_groups(sample_tok, ids)
    assert [g[0] for g in groups] == [0, *(g[1] for g in groups[:-1])] and groups[-1][1] == len(ids)
    assert "".join(g[2] for g in groups) == sample_tok.decode(ids, skip_special_tokens=False,
                                                             clean_up_tokenization_spaces=False)


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


@pytest.mark.skipif(CHROMIUM is None, reason="no Chromium (apt-get install chromium; .ci/run installs it)")
def test_chromium_loads_the_page_and_renders_it(built, tmp_path):
    _, html = built
    shot = tmp_path / "shot.png"
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--window-size=1200,1600",
           "--enable-logging=stderr", "--v=0", f"--screenshot={shot}", html.as_uri()]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    console = [line for line in proc.stderr.splitlines() if "CONSOLE" in line or "Refused to" in line]
    assert not console, console
    dom = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom", html.as_uri()],
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert 'class="histogram"' in dom.stdout and 'class="t ' in dom.stdout
    from PIL import Image

    pixels = np.asarray(Image.open(shot).convert("RGB"), dtype=np.float64)
    assert pixels.shape[0] >= 1000 and pixels.std() > 10  # not blank
    assert len(np.unique(pixels.reshape(-1, 3)[::97], axis=0)) > 20  # text, bars and weight colours


def test_unpacked_build_stats_match_the_manifest(tmp_path, sample_tok):
    from weightprep.config import config_from_dict
    from weightprep.pipeline import build
    from weightprep.report.stats import split_stats

    out = tmp_path / "unpacked"
    cfg = config_from_dict({"pack": {"enabled": False, "seq_len": 1024}})
    build([str(Path(__file__).resolve().parent.parent / "sample_data" / "raw.jsonl")], out, cfg, tokenizer=sample_tok)
    manifest = read_manifest(out)
    stats = split_stats(out, split_shards(manifest), manifest["tokenizer"]["pad_used"])
    counts = manifest["counts"]
    assert stats.rows == counts["rows"] == counts["documents_written"] == len(stats.lengths)
    assert stats.pad_positions == counts["pad_tokens"]
    assert sum(stats.weight_counts.values()) == counts["tokens"] == int(stats.lengths.sum())
    assert np.allclose(stats.fill, stats.lengths / 1024)


@pytest.mark.parametrize("damage", ["cut", "garbage"])
def test_a_damaged_shard_is_refused_by_inspect_and_the_report(built, tmp_path, damage):
    out, _ = built
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    shard = copy / read_manifest(copy)["shards"][0]["filename"]
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) // 2] if damage == "cut" else b"not arrow" * 100)
    for args in (["inspect", str(copy)], ["inspect", str(copy), "--html", str(tmp_path / "r.html")]):
        res = CliRunner().invoke(main, args)
        assert res.exit_code != 0, res.output
        assert "unreadable shard" in res.output or "truncated or was replaced" in res.output, res.output
        assert "Traceback" not in res.output
    assert not (tmp_path / "r.html").exists()


def _reject_positions(html: Path) -> list[str]:
    from html import unescape

    cells = re.findall(r'<tr class="reject"><td class="k">([^<]*)</td>', html.read_text(encoding="utf-8"))
    return [unescape(c) for c in cells]


def test_rejects_are_placed_as_errors_place_them_jsonl_lines_and_parquet_rows(built, tmp_path):
    """A JSONL reject at ``raw.jsonl:6``; a Parquet one at ``d.parquet: row 4`` (it has a row, not a line)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from weightprep.errors import InputError

    out, html = built
    raw = read_manifest(out)["inputs"][0]["path"]
    assert _reject_positions(html) == [f"{raw}:6", f"{raw}:10"]

    records = [{"pieces": [{"text": f"Question {i}?", "weight": 0.0}, {"text": f" Answer {i}.", "weight": 1.0}]}
               for i in range(8)]  # fmt: skip
    records[4]["pieces"][1]["weight"] = -1.0
    path = tmp_path / "d.parquet"
    pq.write_table(pa.Table.from_pylist(records), str(path), row_group_size=3)
    shards, report = tmp_path / "shards", tmp_path / "report.html"
    res = CliRunner().invoke(main, ["build", str(path), "--out", str(shards), "--seq-len", "64", "--skip-invalid"])
    assert res.exit_code == 0, res.output
    res = CliRunner().invoke(main, ["inspect", str(shards), "--html", str(report)])
    assert res.exit_code == 0, res.output
    # the same words as the error the build stops with when invalid rows are not skipped
    where = str(InputError(str(path), 4, "pieces[1].weight", "x")).split(": pieces[1]")[0]
    assert _reject_positions(report) == [where] == [f"{path}: row 4"]
    assert "None" not in report.read_text(encoding="utf-8").split('class="rejects"')[1].split("</table>")[0]


def test_a_hostile_role_is_shown_escaped(tmp_path):
    """Roles are any non-empty string and reach the page from the turns file: as text, never as markup."""
    from chat_support import chat_tokenizer

    role = '<b id="x">&'
    chat_tokenizer("chatml").save_pretrained(tmp_path / "tok")
    convo = [{"role": role, "content": "hi"}, {"role": "assistant", "content": "Hello!"}]
    raw = tmp_path / "raw.jsonl"
    raw.write_text(json.dumps({"messages": convo}) + "\n", encoding="utf-8")
    out, html = tmp_path / "out", tmp_path / "report.html"
    res = CliRunner().invoke(main, ["build", str(raw), "--tokenizer", str(tmp_path / "tok"), "--out", str(out)])
    assert res.exit_code == 0, res.output
    res = CliRunner().invoke(main, ["inspect", str(out), "--html", str(html)])
    assert res.exit_code == 0, res.output
    text = html.read_text(encoding="utf-8")
    escaped = "&lt;b id=&quot;x&quot;&gt;&amp;"
    assert f'<span class="turn" data-role="{escaped}" data-message="0">{escaped} · messages[0]</span>' in text
    assert '<b id=' not in text and 'id="x"' not in text  # neither in the turn heads nor in the tokens
    heads = [a for t, a in parse(html).elements if "turn" in a.get("class", "").split()]
    assert [a["data-role"] for a in heads] == [role, "assistant"]  # the attribute holds the role itself
