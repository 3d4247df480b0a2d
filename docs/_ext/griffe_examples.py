"""Griffe extension used by the API reference: renders ``Example:`` sections as code.

The project's docstrings follow Google style, where both ``Example:`` and
``Examples:`` introduce examples. Griffe only treats ``Examples:`` as such and
renders ``Example:`` as prose, where doctest output like ``[[0, 1], [2]]`` reads
as a Markdown link. This extension renames the heading, and fences examples that
are plain code rather than doctest sessions, before griffe parses the docstring.
"""

from __future__ import annotations

import re
import textwrap

import griffe

_HEADING = re.compile(r"^(?P<indent>[ \t]*)Examples?:[ \t]*$")


def _rewrite(docstring: str) -> str:
    lines = docstring.splitlines()
    out: list = []
    i = 0
    while i < len(lines):
        match = _HEADING.match(lines[i])
        if not match:
            out.append(lines[i])
            i += 1
            continue
        indent = len(match.group("indent").expandtabs())
        body: list = []
        j = i + 1
        while j < len(lines) and (
            not lines[j].strip() or len(lines[j]) - len(lines[j].lstrip()) > indent
        ):
            body.append(lines[j])
            j += 1
        while body and not body[-1].strip():
            body.pop()
        out.append(" " * indent + "Examples:")
        code = textwrap.dedent("\n".join(body))
        if body and ">>>" not in code:
            pad = " " * (indent + 4)
            out.append(pad + "```python")
            out.extend(pad + line if line else "" for line in code.splitlines())
            out.append(pad + "```")
        else:
            out.extend(body)
        out.append("")
        i = j
    return "\n".join(out)


class ExampleSections(griffe.Extension):
    """Rewrites example sections of every loaded object before they are parsed."""

    def on_instance(self, *, obj: griffe.Object, **kwargs) -> None:
        if obj.docstring is not None:
            obj.docstring.value = _rewrite(obj.docstring.value)
