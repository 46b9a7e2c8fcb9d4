"""The checks of ``weightprep.sources``, one problem at a time: no build, no tokenizer, no files.

- every declaration check (``--source`` and a pipeline file's ``sources:``) reports its own problem, naming the
  option or ``sources[i].field``, and nothing else: an unknown key or option, a name not usable in a split name,
  a value that is not a number (a bool is not one), an integer too large for a float, a weight not >= 0 and
  finite in float32, epochs not > 0 and finite, a path that is empty or not a string, a ``columns`` or
  ``role_weights`` that is not a string or that ``--columns`` / ``chat.role_weights`` would refuse, an option
  given twice, an item that is not a mapping;
- epochs are at most ``MAX_EPOCHS`` (README: "a float > 0, at most 1000"): 1000 is allowed, more is not;
- ``manifest_sources`` refuses numbers that do not add up (the sources' written documents, tokens, supervised
  tokens and weight against the rows'; each source's accounting identity; one entry of ``files`` per source),
  which only a bug elsewhere can give, so the inputs here are made inconsistent on purpose.
"""

from __future__ import annotations

import math
from collections import Counter

import pytest

from weightprep.accounting import check_accounting, final_counts
from weightprep.errors import AccountingError, ConfigError
from weightprep.sources import (
    MAX_EPOCHS,
    Source,
    check_source_names,
    manifest_sources,
    parse_source_option,
    sources_from_data,
)

_KEYS = "name, path, weight, epochs, columns, role_weights"  # the keys a source declares, in the README's order


def _problems(data) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        sources_from_data(data, "p.yaml")
    assert caught.value.source == "p.yaml" and "invalid configuration in p.yaml" in str(caught.value)
    return caught.value.problems


# ---- one bad field of a pipeline file's source: exactly its problem -------------------------------------------


@pytest.mark.parametrize(
    ("field", "value", "problem"),
    [
        # not a number: named with its type (a bool is an int to Python, not a weight or a number of epochs)
        ("weight", True, "sources[0].weight: expected a number, got bool True"),
        ("epochs", False, "sources[0].epochs: expected a number, got bool False"),
        ("weight", None, "sources[0].weight: expected a number, got NoneType None"),
        ("epochs", [2], "sources[0].epochs: expected a number, got list [2]"),
        ("weight", {"w": 1}, "sources[0].weight: expected a number, got dict {'w': 1}"),
        ("epochs", "two", "sources[0].epochs: expected a number, got 'two'"),
        # a weight >= 0 and finite in float32 (the shards' dtype); epochs > 0 and finite
        ("weight", -1, "sources[0].weight: must be a finite number >= 0, got -1.0"),
        ("weight", "nan", "sources[0].weight: must be a finite number >= 0, got nan"),
        ("weight", math.inf, "sources[0].weight: must be a finite number >= 0, got inf"),
        ("weight", 1e39, "sources[0].weight: must be a finite number >= 0, got 1e+39 (beyond float32's largest, "
                         "3.4028235e+38: the shards store weights as float32)"),
        ("epochs", 0, "sources[0].epochs: must be a finite number > 0, got 0.0"),
        ("epochs", -0.5, "sources[0].epochs: must be a finite number > 0, got -0.5"),
        ("epochs", "inf", "sources[0].epochs: must be a finite number > 0, got inf"),
        ("epochs", math.nan, "sources[0].epochs: must be a finite number > 0, got nan"),
        # an integer beyond any float (YAML reads 1000...0 as an int): too large, not a crash
        pytest.param("weight", 10**400, f"sources[0].weight: {10**400} is too large", id="weight-10**400"),
        pytest.param("epochs", 10**400, f"sources[0].epochs: {10**400} is too large", id="epochs-10**400"),
        # the path: a file, directory or glob, or a non-empty list of them, each a non-empty string
        ("path", "", "sources[0].path: expected a file, directory or glob (or a list of them), got ['']"),
        ("path", [], "sources[0].path: expected a file, directory or glob (or a list of them), got []"),
        ("path", ["a.jsonl", ""], "sources[0].path: expected a file, directory or glob (or a list of them), "
                                  "got ['a.jsonl', '']"),
        ("path", ["a.jsonl", 3], "sources[0].path: expected a file, directory or glob (or a list of them), "
                                 "got ['a.jsonl', 3]"),
        ("path", 7, "sources[0].path: expected a file, directory or glob (or a list of them), got 7"),
        # columns and role_weights are strings ("prompt=question,...", "assistant=1,tool=0.5")
        ("columns", 5, "sources[0].columns: expected a string, got 5"),
        ("columns", ["prompt=q"], "sources[0].columns: expected a string, got ['prompt=q']"),
        ("role_weights", {"assistant": 1}, "sources[0].role_weights: expected a string, got {'assistant': 1}"),
        # role_weights as chat.role_weights reads them, named as the source's
        ("role_weights", "assistant", "sources[0].chat.role_weights: expected ROLE=WEIGHT[,ROLE=WEIGHT...] with "
                                      "weights >= 0, got 'assistant'"),
        ("role_weights", "assistant=1,tool=-1", "sources[0].chat.role_weights: expected ROLE=WEIGHT[,ROLE=WEIGHT...] "
                                                "with weights >= 0, got 'tool=-1'"),
        # a key not among the source's
        ("colour", "red", f"sources[0].colour: unknown key; expected one of {_KEYS}"),
        # columns as --columns reads it (TARGET=SOURCE, each column mapped once), named as the source's field
        ("columns", "prompt", "sources[0].columns: expected TARGET=SOURCE[,TARGET=SOURCE...], got 'prompt'"),
        ("columns", "prompt=q,completion=", "sources[0].columns: expected TARGET=SOURCE[,TARGET=SOURCE...], "
                                            "got 'completion='"),
        ("columns", "prompt=q,completion=q", "sources[0].columns: column 'q' is mapped twice (prompt=q, "
                                             "completion=q); map each column once"),
    ],
)  # fmt: skip
def test_a_bad_field_is_its_one_problem_named_by_the_field(field, value, problem):
    assert _problems([{"name": "a", "path": "a.jsonl", field: value}]) == [problem]


@pytest.mark.parametrize("name", ["my-set", "a.b", "", "x" * 101, "ü", None, 5])
def test_a_name_not_usable_in_a_split_name_is_its_one_problem(name):
    # validation_NAME is a split (datasets: ^\w+(\.\w+)*$, no '-') and a directory: letters, digits, '_', <= 100
    assert _problems([{"name": name, "path": "a.jsonl"}]) == [
        "sources[0].name: expected a name of letters, digits and '_', at most 100 (it names the split "
        f"validation_NAME), got {name!r}"
    ]


@pytest.mark.parametrize("name", ["x" * 100, "a", "_", "Math_2"])
def test_a_name_of_up_to_100_letters_digits_and_underscores_is_accepted(name):
    assert [s.name for s in sources_from_data([{"name": name, "path": "a.jsonl"}])] == [name]


@pytest.mark.parametrize("weight", [-0.0, "-0", "-0.0"])
def test_a_weight_of_minus_zero_is_plus_zero(weight):
    (source,) = sources_from_data([{"name": "a", "path": "a.jsonl", "weight": weight}])
    assert source.weight == 0 and math.copysign(1.0, source.weight) == 1.0


@pytest.mark.parametrize("data", [[], {"name": "a", "path": "a.jsonl"}, "a=a.jsonl", None])
def test_sources_that_are_not_a_non_empty_list_are_one_problem(data):
    assert _problems(data) == [f"sources: expected a non-empty list of {{name, path, ...}}, got {data!r}"]


@pytest.mark.parametrize(
    ("item", "problem"),
    [
        ("a=a.jsonl", f"sources[1]: expected a mapping of {_KEYS}, got 'a=a.jsonl'"),
        (["a", "a.jsonl"], f"sources[1]: expected a mapping of {_KEYS}, got ['a', 'a.jsonl']"),
        (None, f"sources[1]: expected a mapping of {_KEYS}, got None"),
    ],
)
def test_an_item_that_is_not_a_mapping_is_named_by_its_index(item, problem):
    assert _problems([{"name": "ok", "path": "ok.jsonl"}, item]) == [problem]


def test_every_bad_item_is_reported_not_only_the_first():
    problems = _problems(["x", {"name": "b", "path": "b.jsonl", "weight": True}, 3])
    assert problems == [
        f"sources[0]: expected a mapping of {_KEYS}, got 'x'",
        "sources[1].weight: expected a number, got bool True",
        f"sources[2]: expected a mapping of {_KEYS}, got 3",
    ]


def test_valid_fields_of_every_kind_are_accepted():
    (source,) = sources_from_data([{"name": "qa", "path": ["a.jsonl", "b/*.jsonl"], "weight": 2, "epochs": "1.5",
                                    "columns": "prompt=question,completion=answer",
                                    "role_weights": "assistant=1,tool=0.5"}])  # fmt: skip
    assert source == Source("qa", ("a.jsonl", "b/*.jsonl"), 2.0, 1.5, "prompt=question,completion=answer",
                            "assistant=1,tool=0.5")  # fmt: skip
    assert type(source.weight) is float and type(source.epochs) is float


# ---- --source NAME=PATH[,weight=W][,epochs=E] -----------------------------------------------------------------


@pytest.mark.parametrize("key", ["weight", "epochs"])
def test_an_option_given_twice_is_a_problem_not_the_last_one_winning(key):
    text = f"a=a.jsonl,{key}=2,{key}=3"
    with pytest.raises(ConfigError) as caught:
        parse_source_option(text)
    assert caught.value.problems == [f"--source {text}: {key} given twice"]


@pytest.mark.parametrize("option", ["foo=1", "weight", "columns=prompt=q", "role_weights=assistant=1"])
def test_an_option_other_than_weight_or_epochs_is_unknown(option):
    text = f"a=a.jsonl,{option}"
    with pytest.raises(ConfigError) as caught:
        parse_source_option(text)
    assert caught.value.problems == [
        f"--source {text}: unknown option {option!r}; expected weight=W or epochs=E (a path with a comma, "
        "per-source columns or role_weights: use a pipeline file's sources:)"
    ]


def test_a_source_option_without_a_path_is_one_problem():
    with pytest.raises(ConfigError) as caught:
        parse_source_option("a.jsonl,weight=2")
    assert caught.value.problems == ["--source a.jsonl,weight=2: expected NAME=PATH[,weight=W][,epochs=E]"]


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("a=a.jsonl,weight=yes", "weight: expected a number, got 'yes'"),
        ("a=a.jsonl,epochs=1001", "epochs: 1001 is more than 1000: each copy is a packing pass of every part; "
                                  "give fewer epochs"),
    ],
)  # fmt: skip
def test_a_bad_option_value_names_the_whole_option_then_the_field(text, problem):
    """``--source a=a.jsonl,weight=yes: weight: ...`` (not ``...weight=yes.weight: ``, which reads as one value)."""
    with pytest.raises(ConfigError) as caught:
        parse_source_option(text)
    assert caught.value.problems == [f"--source {text}: {problem}"]


# ---- epochs: at most MAX_EPOCHS -------------------------------------------------------------------------------


def _too_many(epochs: str, where: str) -> str:
    rest = "each copy is a packing pass of every part; give fewer epochs"
    return f"{where}.epochs: {epochs} is more than 1000: {rest}"


def test_max_epochs_is_the_documented_1000():
    assert MAX_EPOCHS == 1000  # README: "epochs E (a float > 0, at most 1000, default 1)"


@pytest.mark.parametrize("epochs", [999, 999.5, 1000, 1000.0, "1000", "1e3"])
def test_epochs_up_to_and_including_the_limit_are_accepted(epochs):
    (source,) = sources_from_data([{"name": "a", "path": "a.jsonl", "epochs": epochs}])
    assert source.epochs == float(epochs)
    assert parse_source_option(f"a=a.jsonl,epochs={epochs}").epochs == float(epochs)
    check_source_names([source])  # a Source made in Python is checked as a declaration is: no error either


@pytest.mark.parametrize(
    ("epochs", "shown"),
    [(1000.5, "1000.5"), (1001, "1001"), (2000, "2000"), (1e6, "1000000"), (1000.0000001, "1000.0000001")],
)  # every digit: a number just above the limit is not shown as the limit
def test_epochs_beyond_the_limit_are_refused(epochs, shown):
    assert _problems([{"name": "a", "path": "a.jsonl", "epochs": epochs}]) == [_too_many(shown, "sources[0]")]
    with pytest.raises(ConfigError) as caught:
        check_source_names([Source("a", ("a.jsonl",), 1.0, float(epochs))])
    assert caught.value.problems == [_too_many(shown, "source 'a'")]


# ---- manifest_sources: the sources' numbers against the rows' -------------------------------------------------

_SOURCES = [Source("a", ("a.jsonl",), 1.0, 1.0), Source("b", ("b.jsonl",), 0.5, 2.0)]
_WRITTEN = ("documents_written", "tokens", "supervised_tokens")  # what the rows are counted by too
_ALL_SPLITS = ("train", "validation_a", "validation_b")


def _doc(accepted: int, tokens: int, supervised: int, weight: float, *, times: int = 1) -> Counter:
    """A source's raw counters in one split of one part: ``accepted`` records, one document each, each written
    ``times`` times (its epochs), all tokens kept."""
    return Counter({
        "accepted": accepted, "documents": accepted, "documents_written": accepted * times,
        "documents_repeated": accepted * (times - 1), "repeats": accepted * (times - 1),
        "tokens_accepted": tokens, "tokens_repeated": tokens * (times - 1), "tokens": tokens * times,
        "supervised_tokens": supervised * times, "weight_accepted": weight, "weight_repeated": weight * (times - 1),
        "total_weight": weight * times,
    })  # fmt: skip


def _inputs(names: tuple[str, ...]) -> tuple[list[list[str]], list[dict], dict[str, Counter]]:
    """Two parts of two sources (b: 2 epochs, one rejected record) in the splits ``names``, and the rows' counts:
    the sum of the sources' (consistent; a test then breaks one number)."""
    parts = [
        [{n: _doc(2, 10, 8, 0.5) for n in names}, {n: _doc(1, 6, 5, 1 / 3, times=2) for n in names}],
        [{n: _doc(1, 4, 4, 1 / 6) for n in names}, {n: _doc(1, 6, 5, 1 / 3, times=2) for n in names}],
    ]
    results = [{"sources": [{n: dict(c) for n, c in by_split.items()} for by_split in part],
                "source_rejected": [{}, {"bad_weight": 1} if i == 0 else {}]}
               for i, part in enumerate(parts)]  # fmt: skip
    splits = {n: Counter(rows=3) for n in names}
    for part in parts:
        for by_split in part:
            for n, c in by_split.items():
                splits[n].update({k: c[k] for k in (*_WRITTEN, "total_weight")})
    return [["a.jsonl"], ["b.jsonl"]], results, splits


@pytest.mark.parametrize("names", [("",), _ALL_SPLITS])
def test_consistent_numbers_give_each_sources_sums_rounded_as_the_manifests(names):
    files, results, splits = _inputs(names)
    entries = manifest_sources(_SOURCES, files, results, splits)
    a, b = entries
    assert [a["name"], b["name"]] == ["a", "b"] and a["paths"] == ["a.jsonl"] and b["epochs"] == 2.0
    for entry in entries:
        check_accounting(entry["counts"])
    k = len(names)
    assert (a["records"], a["documents"], a["tokens"], a["supervised_tokens"]) == (3 * k, 3 * k, 14 * k, 12 * k)
    assert (b["records"], b["rejected"], b["repeats"], b["tokens"]) == (2 * k + 1, {"bad_weight": 1}, 2 * k, 24 * k)
    # the train split's weight is 2/3 (a) + 4/3 (b) = 2: shares and every total_weight rounded to 6 decimals
    assert (a["weight_share"], b["weight_share"]) == (0.333333, 0.666667)
    for n in names:
        assert a["splits"][n or "train"] == {"documents_written": 3, "tokens": 14, "supervised_tokens": 12,
                                             "records": 3, "total_weight": 0.666667}  # fmt: skip
        assert b["splits"][n or "train"]["total_weight"] == 1.333333
        # as the split's own manifest number (final_counts), rounded alike: they add up to it
        split_weight = final_counts(splits[n], Counter(), 1)["total_weight"]
        assert a["splits"][n or "train"]["total_weight"] + b["splits"][n or "train"]["total_weight"] == split_weight


@pytest.mark.parametrize("key", _WRITTEN)
@pytest.mark.parametrize(("names", "broken"), [(("",), ""), (_ALL_SPLITS, "validation_b")])
def test_written_numbers_that_do_not_sum_to_the_rows_are_an_accounting_error(key, names, broken):
    files, results, splits = _inputs(names)
    per_source = [sum(r["sources"][s][broken][key] for r in results) for s in range(2)]
    splits[broken][key] += 1
    with pytest.raises(AccountingError) as caught:
        manifest_sources(_SOURCES, files, results, splits)
    label = broken or "train"  # a build without a validation split has one split, "": the train split
    assert caught.value.problems == [
        f"split {label}: the sources' {key} {per_source} do not sum to the rows' {sum(per_source) + 1}"
    ]


def test_a_weight_that_does_not_sum_to_the_rows_is_an_accounting_error():
    files, results, splits = _inputs(("",))
    splits[""]["total_weight"] = 2.5  # the sources' add up to 2
    with pytest.raises(AccountingError) as caught:
        manifest_sources(_SOURCES, files, results, splits)
    assert caught.value.problems == ["split train: the sources' weight does not sum to the rows' 2.5"]


def test_every_sum_that_disagrees_is_reported():
    files, results, splits = _inputs(_ALL_SPLITS)
    splits["train"]["tokens"] -= 2
    splits["validation_a"]["total_weight"] += 1e-3
    with pytest.raises(AccountingError) as caught:
        manifest_sources(_SOURCES, files, results, splits)
    assert caught.value.problems == [
        "split train: the sources' tokens [14, 24] do not sum to the rows' 36",
        f"split validation_a: the sources' weight does not sum to the rows' {splits['validation_a']['total_weight']}",
    ]


def test_weights_summed_in_another_order_are_not_an_error():
    # float32 weights summed in float64 by part, by source and by row: the same sum up to rounding
    files, results, splits = _inputs(("",))
    splits[""]["total_weight"] = math.nextafter(math.nextafter(splits[""]["total_weight"], 3.0), 3.0)  # 2 ulps
    assert len(manifest_sources(_SOURCES, files, results, splits)) == 2


def test_a_source_whose_own_numbers_break_the_identity_is_an_accounting_error():
    # a's documents written one more than its documents (no repeats: one epoch), the rows agreeing: only the
    # per-source identity can see it
    files, results, splits = _inputs(("",))
    results[1]["sources"][0][""]["documents_written"] += 1
    splits[""]["documents_written"] += 1
    with pytest.raises(AccountingError) as caught:
        manifest_sources(_SOURCES, files, results, splits)
    assert len(caught.value.problems) == 1
    assert caught.value.problems[0].startswith("documents written 4 != documents 3 - dropped 0 - chunked 0")


def test_a_source_whose_weight_breaks_the_identity_is_an_accounting_error():
    files, results, splits = _inputs(("",))
    results[0]["sources"][1][""]["weight_accepted"] += 0.5  # b accepted more weight than it wrote or removed
    with pytest.raises(AccountingError, match=r"^internal error") as caught:
        manifest_sources(_SOURCES, files, results, splits)
    assert [p.split(" != ")[0] for p in caught.value.problems] == [f"weight written {2 / 3 + 2 / 3!r}"]


@pytest.mark.parametrize("files", [[["a.jsonl"]], [["a.jsonl"], ["b.jsonl"], ["c.jsonl"]]])
def test_files_not_one_per_source_is_an_error_not_a_source_left_out(files):
    _, results, splits = _inputs(("",))
    with pytest.raises(ValueError, match="zip"):
        manifest_sources(_SOURCES, files, results, splits)
