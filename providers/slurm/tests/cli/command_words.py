"""Taking a built command line apart into its words, as the remote shell will."""

from __future__ import annotations

import shlex


def argv_of(command: str) -> list[str]:
    """The words a POSIX shell would pass, after dropping a leading VAR=value assignment."""
    words = shlex.split(command)
    while words and "=" in words[0] and not words[0].startswith("-") and words[0].split("=")[0].isidentifier():
        words = words[1:]
    return words
