"""The words of a failure, without Qt: the message a user looks for, out of a wall of TensorFlow text."""

from __future__ import annotations

import re
from collections.abc import Iterable

#: ``SomeError: message`` (module-qualified or not), as Python prints an exception's last line.
_EXCEPTION = re.compile(r"(?:^|[\s:(])((?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception|Exit|Interrupt)): (.+?)"
                        r"(?=\s+(?:[A-Za-z_][\w.]*(?:Error|Exception)): |\s*$)")
#: Exceptions that only wrap another one's message: TensorFlow's ``errors_impl`` and the like.
_WRAPPERS = ("tensorflow.", "tf.", "errors_impl.", "Graph execution error")


def headline(reason: str, log_tail: Iterable[str] = ()) -> str:
    """The exception a person wrote (their assertion, their ValueError) when ``reason`` or the log's
    last lines hold one besides TensorFlow's wrappers: ``AssertionError: labels must be 0..9``; the
    last exception seen otherwise; ``""`` when there is none."""
    found: list[tuple[str, str]] = []
    for text in (*log_tail, reason):
        for line in text.splitlines() or [text]:
            found.extend((m.group(1), m.group(2).strip()) for m in _EXCEPTION.finditer(line))
    if not found:
        return ""
    own = [(kind, message) for kind, message in found
           if not kind.startswith(_WRAPPERS) and not message.startswith(_WRAPPERS[3])]
    kind, message = (own or found)[-1]
    return f"{kind}: {message}"
