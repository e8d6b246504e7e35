"""Notes on a job: a site's rules (api/notes.yaml, or JOBSCOPE_NOTE_RULES) turn a job's
footprint, silences, energy and metadata into notes with a severity, a text and a link.

The conditions are a small typed language, not code: each is a mapping of known keys
(`footprint`, `silent`, `energy`, `metadata`) with typed values, validated when the file
loads; nothing in a rules file is evaluated, compiled as a regular expression or formatted
with attribute access. Metric names are globs of `[A-Za-z0-9_:.-]`, `*` and `?` only
(matched as the registry's patterns are). Texts are `string.Template`s whose `$names` must
be fields the rule's conditions provide. YAML anchors and aliases and any tag are refused.
Errors name file, line and field.

`python -m api.notes check FILE` validates a site's file without starting the API."""

from __future__ import annotations

import string
import sys
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal
from urllib.parse import quote

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from api import site_file
from api.site_file import SiteFileError

SHIPPED = Path(__file__).with_name("notes.yaml")
"""The rules jobscope ships (the default of JOBSCOPE_NOTE_RULES)."""
SEVERITIES = ("info", "warning", "alert")
"""From the least to the worst."""
COMMON_FIELDS = frozenset({"job_id", "user", "project", "duration_s", "rule"})
"""Template fields every rule may use."""
_GLOB = r"^[A-Za-z0-9_:.*?-]{1,128}$"

Fraction = Annotated[float, Field(ge=0, le=1)]
Glob = Annotated[str, Field(pattern=_GLOB)]


class NoteRulesError(SiteFileError):
    """An invalid rules file: each line reads `file:line: field: problem`."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class FootprintCondition(_Strict):
    """Nodes whose `metric` sat below (or above) a position between the registry's idle
    and peak for more than `for_fraction_above` of the time it was measured. Positions are
    kept in tenths, so the level is a multiple of 0.1."""

    metric: Glob
    position_below: Fraction | None = None
    position_above: Fraction | None = None
    for_fraction_above: Fraction = 0.0

    @model_validator(mode="after")
    def _one_level(self) -> FootprintCondition:
        levels = [v for v in (self.position_below, self.position_above) if v is not None]
        if len(levels) != 1:
            raise ValueError("give exactly one of position_below and position_above")
        if abs(levels[0] * 10 - round(levels[0] * 10)) > 1e-9:
            raise ValueError("a position level is a multiple of 0.1 (positions are in tenths)")
        if self.metric.count("*") > 4:
            raise ValueError("at most 4 '*' in a metric glob")
        return self

    FIELDS: ClassVar[frozenset[str]] = frozenset({"metric", "nodes", "fraction", "position"})


class SilentCondition(_Strict):
    """Nodes without any reading for more than `seconds_above` seconds and more than
    `fraction_above` of the job."""

    seconds_above: float = Field(0.0, ge=0)
    fraction_above: Fraction = 0.0

    FIELDS: ClassVar[frozenset[str]] = frozenset({"nodes", "silent_s", "fraction"})


class EnergyCondition(_Strict):
    """Nodes whose energy covers less than `coverage_below` of the job (a job measured by
    no power source at all gets no such note: nothing to cover)."""

    coverage_below: Fraction

    FIELDS: ClassVar[frozenset[str]] = frozenset({"nodes", "coverage"})


_TEXT_FIELDS = ("user", "project", "queue", "state", "site")
_NUMBER_FIELDS = ("duration_s", "nodes_count")


class MetadataCondition(_Strict):
    """A field of the job compared: text fields by `equals`/`one_of`, numbers by
    `above`/`below`."""

    field: Literal["user", "project", "queue", "state", "site", "duration_s", "nodes_count"]
    equals: str | None = None
    one_of: list[str] | None = Field(None, max_length=100)
    above: float | None = None
    below: float | None = None

    @model_validator(mode="after")
    def _typed(self) -> MetadataCondition:
        text = [self.equals, self.one_of]
        number = [self.above, self.below]
        if self.field in _TEXT_FIELDS and (
            any(v is not None for v in number) or text == [None] * 2
        ):
            raise ValueError(f"{self.field} is text: compare it with equals or one_of")
        if self.field in _NUMBER_FIELDS and (
            any(v is not None for v in text) or number == [None] * 2
        ):
            raise ValueError(f"{self.field} is a number: compare it with above or below")
        return self


class When(_Strict):
    """Every condition given must hold; node conditions must hold on the same nodes."""

    footprint: FootprintCondition | None = None
    silent: SilentCondition | None = None
    energy: EnergyCondition | None = None
    metadata: list[MetadataCondition] = Field(default_factory=list, max_length=20)

    @model_validator(mode="after")
    def _some(self) -> When:
        if not (self.footprint or self.silent or self.energy or self.metadata):
            raise ValueError("give at least one of footprint, silent, energy, metadata")
        return self

    def fields(self) -> frozenset[str]:
        out = set(COMMON_FIELDS)
        for condition in (self.footprint, self.silent, self.energy):
            if condition is not None:
                out |= condition.FIELDS
        return frozenset(out)


class Rule(_Strict):
    id: str = Field(pattern=r"^[a-z0-9][a-z0-9-]{0,63}$")
    severity: Literal["info", "warning", "alert"]
    when: When
    text: str = Field(min_length=1, max_length=500)
    link: str | None = Field(None, max_length=500, pattern=r"^(https?://|/)[^\s]*$")
    """May use the common fields ($job_id...), each URL-quoted."""

    @field_validator("text")
    @classmethod
    def _text(cls, text: str, info: ValidationInfo) -> str:
        when = info.data.get("when")
        template = string.Template(text)
        if not template.is_valid():
            raise ValueError("a '$' not followed by a field name (write $$ for '$')")
        known = when.fields() if isinstance(when, When) else COMMON_FIELDS
        unknown = set(template.get_identifiers()) - known
        if unknown:
            raise ValueError(
                f"unknown field(s) {sorted(unknown)}; known: {', '.join(sorted(known))}"
            )
        return text

    @field_validator("link")
    @classmethod
    def _link(cls, link: str | None) -> str | None:
        template = string.Template(link or "")
        if not template.is_valid() or set(template.get_identifiers()) - COMMON_FIELDS:
            raise ValueError(f"only the fields {sorted(COMMON_FIELDS)} may be used")
        return link


class Rules(_Strict):
    rules: list[Rule] = Field(default_factory=list, max_length=200)

    @model_validator(mode="after")
    def _unique(self) -> Rules:
        ids = [rule.id for rule in self.rules]
        twice = sorted({i for i in ids if ids.count(i) > 1})
        if twice:
            raise ValueError(f"rule ids given twice: {twice}")
        return self


# ---- loading -----------------------------------------------------------------------------


FILE = site_file.SiteFile(
    Rules,
    shipped=SHIPPED,
    env="JOBSCOPE_NOTE_RULES",
    entry_key="id",
    shape="a mapping with a list of `rules`",
    holds="rules",
    error=NoteRulesError,
)


def load(path: Path) -> Rules:
    """The rules of `path`; NoteRulesError naming file:line: field: problem otherwise."""
    return FILE.load(path)


def use(path: Path) -> Rules:
    """Load `path` as the API's rules (create_app calls it: a bad file stops the start)."""
    return FILE.use(path)


def rules() -> Rules:
    """The API's rules: those create_app loaded, else JOBSCOPE_NOTE_RULES's file."""
    return FILE.current()


# ---- evaluating ----------------------------------------------------------------------------


Found = tuple[bool, set[str] | None, dict[str, Any]]
"""Whether a condition holds, on which nodes (None: not a node condition), its fields."""


def evaluate(ruleset: Rules, job: dict[str, Any], summary: dict[str, Any]) -> list[dict[str, Any]]:
    """The notes of a job: `job` its metadata (Job fields), `summary` with `footprint`,
    `silent` and energy. Worst severity first."""
    notes = [note for rule in ruleset.rules if (note := _note(rule, job, summary)) is not None]
    return sorted(notes, key=lambda n: (-SEVERITIES.index(n["severity"]), n["id"]))


def worst(notes: list[dict[str, Any]]) -> str:
    """The worst severity of `notes`, '' without any."""
    return max((n["severity"] for n in notes), key=SEVERITIES.index, default="")


def _note(rule: Rule, job: dict[str, Any], summary: dict[str, Any]) -> dict[str, Any] | None:
    when = rule.when
    found: list[Found] = [_metadata(c, job, summary) for c in when.metadata]
    if when.footprint is not None:
        found.append(_footprint(when.footprint, summary))
    if when.silent is not None:
        found.append(_silent(when.silent, summary))
    if when.energy is not None:
        found.append(_energy(when.energy, job, summary))
    if not all(holds for holds, _, _ in found):
        return None
    node_sets = [nodes for _, nodes, _ in found if nodes is not None]
    nodes = set.intersection(*node_sets) if node_sets else set()
    if node_sets and not nodes:
        return None
    common: dict[str, Any] = {
        "job_id": job.get("job_id", ""),
        "user": job.get("user", ""),
        "project": job.get("project", ""),
        "duration_s": f"{summary.get('duration_s') or 0:.0f}",
        "rule": rule.id,
    }
    fields = dict(common)
    for _, _, extra in found:
        fields.update(extra)
    fields["nodes"] = _node_list(sorted(nodes))
    return {
        "id": rule.id,
        "severity": rule.severity,
        "text": string.Template(rule.text).safe_substitute(fields),
        "link": _link(rule.link, common),
        "nodes": sorted(nodes),
    }


def _link(link: str | None, common: dict[str, Any]) -> str | None:
    if link is None:
        return None
    quoted = {k: quote(str(v), safe="") for k, v in common.items()}
    return string.Template(link).safe_substitute(quoted)


def _node_list(nodes: list[str], shown: int = 8) -> str:
    if len(nodes) <= shown:
        return ", ".join(nodes)
    return f"{', '.join(nodes[:shown])} and {len(nodes) - shown} more"


def _percent(value: float) -> str:
    return f"{value:.0%}"


def _footprint(c: FootprintCondition, summary: dict[str, Any]) -> Found:
    nodes: dict[str, tuple[float, float]] = {}
    metric = ""
    for row in summary.get("footprint", []):
        if not fnmatchcase(row["metric_id"], c.metric):
            continue
        for node in row.get("nodes", []):
            fraction = _time_fraction(node.get("deciles") or [], c)
            if fraction is None or fraction <= c.for_fraction_above:
                continue
            if fraction > nodes.get(node["node"], (-1.0, 0.0))[0]:
                nodes[node["node"]] = (fraction, node.get("position") or 0.0)
                metric = row["metric_id"]
    if not nodes:
        return False, set(), {}
    fraction, position = max(nodes.values())
    fields = {"metric": metric, "fraction": _percent(fraction), "position": f"{position:.2f}"}
    return True, set(nodes), fields


def _time_fraction(deciles: list[float], c: FootprintCondition) -> float | None:
    """The fraction of measured time below (above) the condition's level."""
    if len(deciles) != 10 or sum(deciles) <= 0:
        return None
    if c.position_below is not None:
        part = deciles[: round(c.position_below * 10)]
    else:
        part = deciles[round((c.position_above or 0) * 10) :]
    return sum(part) / sum(deciles)


def _silent(c: SilentCondition, summary: dict[str, Any]) -> Found:
    hits = {
        row["node"]: row
        for row in summary.get("silent", [])
        if row["silent_s"] > c.seconds_above and row["fraction"] > c.fraction_above
    }
    if not hits:
        return False, set(), {}
    worst_row = max(hits.values(), key=lambda r: r["silent_s"])
    fields = {
        "silent_s": f"{worst_row['silent_s']:.0f}",
        "fraction": _percent(worst_row["fraction"]),
    }
    return True, set(hits), fields


def node_coverage(summary: dict[str, Any]) -> dict[str, float]:
    """Energy coverage per node: `energy_nodes` when the summary has them, else the best
    measured source of each node; nodes of the job without any source count 0 once some
    node has one."""
    rows = summary.get("energy_nodes")
    if rows:
        return {r["node"]: float(r.get("coverage") or 0.0) for r in rows}
    duration = summary.get("duration_s") or 0.0
    out: dict[str, float] = {}
    for row in summary.get("energy", []):
        if not row.get("pushed") and duration > 0:
            out[row["node"]] = max(out.get(row["node"], 0.0), row["covered_s"] / duration)
    return out


def _energy(c: EnergyCondition, job: dict[str, Any], summary: dict[str, Any]) -> Found:
    coverage = node_coverage(summary)
    if not coverage:
        return False, set(), {}
    for node in job.get("nodes") or []:
        coverage.setdefault(node, 0.0)
    low = {node: value for node, value in coverage.items() if value < c.coverage_below}
    if not low:
        return False, set(), {}
    return True, set(low), {"coverage": _percent(min(low.values()))}


def _metadata(c: MetadataCondition, job: dict[str, Any], summary: dict[str, Any]) -> Found:
    if c.field == "duration_s":
        value: Any = summary.get("duration_s") or 0.0
    elif c.field == "nodes_count":
        value = len(job.get("nodes") or [])
    else:
        value = job.get(c.field) or ""
    holds = (
        (c.equals is None or value == c.equals)
        and (c.one_of is None or value in c.one_of)
        and (c.above is None or value > c.above)
        and (c.below is None or value < c.below)
    )
    return holds, None, {}


def main(argv: list[str]) -> int:
    """`python -m api.notes check FILE...`: 0 when every file is valid."""
    return FILE.check(argv, "api.notes", lambda ruleset: f"{len(ruleset.rules)} rules")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
