"""The provider's public surface: ``slurm_provider.__all__``, each name loaded from its module on first use."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import slurm_provider

INIT = Path(slurm_provider.__file__)


def test_every_public_name_resolves_to_the_object_of_its_module() -> None:
    import importlib

    for name in slurm_provider.__all__:
        value = getattr(slurm_provider, name)
        if name == "timing":
            assert value is importlib.import_module("slurm_provider.timing")
            continue
        module = importlib.import_module(f"slurm_provider.{slurm_provider._MODULE_OF[name]}")
        assert value is getattr(module, name), name


def test_the_type_checkers_imports_name_the_same_public_names() -> None:
    """The names a type checker sees (``if TYPE_CHECKING:``) are the ones loaded at run time, from the same modules."""
    tree = ast.parse(INIT.read_text())
    [guard] = [node for node in tree.body if isinstance(node, ast.If) and getattr(node.test, "id", "") == "TYPE_CHECKING"]
    seen: dict[str, str] = {}
    for node in guard.body:
        assert isinstance(node, ast.ImportFrom) and node.module, ast.dump(node)
        for alias in node.names:
            seen[alias.name] = node.module.removeprefix("slurm_provider").lstrip(".") or alias.name
    assert seen == {**slurm_provider._MODULE_OF, "timing": "timing"}


def test_importing_the_package_loads_no_operator_trigger_or_hook() -> None:
    """Airflow's provider discovery imports the package: that must not pull in the task machinery."""
    code = ("import sys, slurm_provider; "
            "print(sorted(m for m in sys.modules if m.startswith('slurm_provider.')))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    for heavy in ("slurm_provider.operators", "slurm_provider.triggers", "slurm_provider.hooks"):
        assert f"'{heavy}'" not in loaded, loaded
