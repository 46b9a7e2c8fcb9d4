"""The mutation check's own bookkeeping (tools/mutate.py): an equivalent-mutant entry that names no mutant of
today's code (the code was edited or renamed under it) would silently stop explaining anything."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

TOOL = Path(__file__).resolve().parent.parent / "tools" / "mutate.py"


def test_every_equivalent_mutant_names_a_mutant_of_todays_code():
    spec = importlib.util.spec_from_file_location("mutate_tool", TOOL)
    mutate = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mutate  # dataclasses look their module up there
    spec.loader.exec_module(mutate)
    modules = {key.split(":")[0] for key in mutate.EQUIVALENT}
    assert modules <= set(mutate.MODULES)
    ids = {m.id for module in modules for m, _ in mutate.mutants(module)}
    stale = sorted(set(mutate.EQUIVALENT) - ids)
    assert not stale, f"EQUIVALENT names mutants that no longer exist (refresh from --list): {stale}"
    assert all(why.strip() for why in mutate.EQUIVALENT.values())
