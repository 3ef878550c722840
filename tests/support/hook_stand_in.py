"""A base for stand-ins of ``SlurmHook``: patched in as the hook class, it is its own instance."""

from __future__ import annotations

from typing import Any


class HookStandIn:
    """Used as ``monkeypatch.setattr(hooks, "SlurmHook", stand_in)``: constructing the "hook" with a
    connection id returns the stand-in itself, and ``with`` blocks open and close nothing."""

    def __call__(self, conn_id: str) -> Any:
        return self

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        pass
