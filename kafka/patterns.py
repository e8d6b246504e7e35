"""Users' metric patterns, matched in time linear in the name: RE2, never Python's `re`.

A pattern a user sends (an on-demand `metrics` regex, the API's metric globs) meets metric
names on an event loop: the API's, or a producer shard's. Python's `re` backtracks, so
`(a+)+$`, or a glob of ten `*`, takes seconds to hours on one short name while every other
request or poll of the process waits. RE2 (google-re2) runs in time linear in the name and
refuses what it cannot run so (backreferences, look-around). Each name's answer is kept
(a bounded memo), so a stream of readings costs a dict lookup per reading.

Part of the Kafka contract (kafka/): the producers and the API share it; it imports nothing
of either.
"""

from __future__ import annotations

from collections.abc import Sequence

import re2

_MEMO_NAMES = 10_000
"""Names whose answer a matcher keeps; past that the memo starts again (names are few)."""


class PatternError(ValueError):
    """A pattern too long, or one RE2 does not take; the message says which."""


def compile_regex(source: str, *, dot_nl: bool = False) -> re2._Regexp:
    """RE2 of a pattern, or PatternError. The caller bounds the text; RE2 bounds the program
    it compiles to (8 MiB: larger is an error, not a slow match)."""
    options = re2.Options()
    options.log_errors = False
    options.dot_nl = dot_nl
    try:
        return re2.compile(source, options)
    except re2.error as exc:
        reason = exc.args[0] if exc.args else "invalid"
        if isinstance(reason, bytes):
            reason = reason.decode(errors="replace")
        raise PatternError(f"not a regular expression RE2 takes: {reason}") from None


class NameMatcher:
    """Whether a metric name matches: from its start (`whole=False`, as `re.match`), or in
    full (`whole=True`), by any of `regexes`; or it is one of `exact`."""

    def __init__(
        self,
        pattern: str,
        regexes: Sequence[re2._Regexp],
        *,
        whole: bool,
        exact: frozenset[str] = frozenset(),
    ) -> None:
        self.pattern = pattern
        """The user's text, for messages."""
        self._regexes = tuple(regexes)
        self._whole = whole
        self._exact = exact
        self._memo: dict[str, bool] = {}

    def match(self, name: str) -> bool:
        answer = self._memo.get(name)
        if answer is None:
            answer = name in self._exact or any(
                (r.fullmatch(name) if self._whole else r.match(name)) is not None
                for r in self._regexes
            )
            if len(self._memo) >= _MEMO_NAMES:
                self._memo.clear()
            self._memo[name] = answer
        return answer


def prefix_matcher(pattern: str, max_chars: int) -> NameMatcher:
    """A user's regex matched from the start of the name (Kwollect's `monitor='<regexp>'`);
    PatternError if longer than `max_chars` or not RE2's."""
    if len(pattern) > max_chars:
        raise PatternError(f"longer than {max_chars} characters")
    return NameMatcher(pattern, [compile_regex(pattern)], whole=False)
