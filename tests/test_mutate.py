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
    ids = {m.id for module in modules for m, _ in mutate.mutants(module, trees=False)}
    stale = sorted(set(mutate.EQUIVALENT) - ids)
    assert not stale, f"EQUIVALENT names mutants that no longer exist (refresh from --list): {stale}"
    assert all(why.strip() for why in mutate.EQUIVALENT.values())


def test_the_mutants_listed_alone_are_those_of_the_mutated_trees():
    """``mutants(trees=False)`` (what the check above and ``--list`` use: each statement mutated in a copy of itself)
    names every mutant as the run does, each made in a copy of the whole module."""
    spec = importlib.util.spec_from_file_location("mutate_tool", TOOL)
    mutate = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mutate
    spec.loader.exec_module(mutate)
    for module in ("stages/mask.py", "stages/write.py"):
        full = [(m, mutate.ast.unparse(tree)) for m, tree in mutate.mutants(module)]
        alone = mutate.mutants(module, trees=False)
        assert [m for m, _ in full] == [m for m, _ in alone] and len(full) > 20
        assert all(tree is None for _, tree in alone)
        assert len({text for _, text in full}) == len(full)  # each tree its own mutant
