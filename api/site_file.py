"""A site's YAML file (the metric registry, the note rules) read into a typed model.

A site file is plain data: files over a size bound, YAML tags (even safe ones), anchors and
aliases (no alias bombs) and keys given twice (YAML loaders keep the last silently) are
refused. Every error reads `file:line: field: problem`, the line read from the YAML node of
the field; a list entry is named by its `entry_key` (`metrics[node_power].unit`)."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Generic, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

MAX_FILE_BYTES = 256 * 1024

Model = TypeVar("Model", bound=BaseModel)


class SiteFileError(ValueError):
    """An invalid site file: each line reads `file:line: field: problem`."""


def load(
    path: Path,
    model: type[Model],
    *,
    entry_key: str,
    shape: str,
    holds: str,
    error: type[SiteFileError] = SiteFileError,
) -> Model:
    """`path` validated as `model`; `error` naming file:line: field: problem otherwise.

    `shape` says what the top level must be (`a mapping with ...`), `holds` what the file
    holds, for the refusal of tags and aliases (`tags are not accepted in <holds>`)."""
    try:
        if path.stat().st_size > MAX_FILE_BYTES:
            raise error(f"{path}:0: (file): larger than {MAX_FILE_BYTES} bytes")
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise error(f"{path}:0: (file): {exc.strerror or exc}") from exc
    try:
        refused = _not_plain(text, holds)
        if refused:
            raise error(f"{path}:{refused[0]}: (yaml): {refused[1]}")
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        line = (exc.problem_mark.line + 1) if exc.problem_mark else 0
        context = exc.context_mark and f" ({exc.context} at line {exc.context_mark.line + 1})"
        raise error(f"{path}:{line}: (yaml): {exc.problem}{context or ''}") from exc
    if not isinstance(data, dict):
        raise error(f"{path}:1: (file): {shape}")
    if twice := list(_duplicate_keys(root, "", entry_key)):
        raise error("\n".join(f"{path}:{line}: {field}: given twice" for line, field in twice))
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise error("\n".join(_located(path, root, e, entry_key) for e in exc.errors())) from exc


class SiteFile(Generic[Model]):
    """One kind of site file: its model, the file jobscope ships, the environment variable
    naming a site's own, and the one the API uses (loaded once, at its start)."""

    def __init__(
        self,
        model: type[Model],
        *,
        shipped: Path,
        env: str,
        entry_key: str,
        shape: str,
        holds: str,
        error: type[SiteFileError],
    ) -> None:
        self.model, self.shipped, self.env, self.error = model, shipped, env, error
        self._how = {"entry_key": entry_key, "shape": shape, "holds": holds}
        self._current: Model | None = None

    def load(self, path: Path) -> Model:
        return load(path, self.model, error=self.error, **self._how)

    def use(self, path: Path) -> Model:
        """Load `path` as the API's file (create_app calls it: a bad file stops the start)."""
        self._current = self.load(path)
        return self._current

    def current(self) -> Model:
        """The API's file: the one create_app loaded, else the environment variable's."""
        if self._current is None:
            return self.use(Path(os.environ.get(self.env) or self.shipped))
        return self._current

    def check(self, argv: list[str], prog: str, described: Callable[[Model], str]) -> int:
        """`python -m <prog> check FILE...`: 0 when every file is valid, each described."""
        if len(argv) < 2 or argv[0] != "check":
            print(f"usage: python -m {prog} check FILE...", file=sys.stderr)
            return 2
        status = 0
        for name in argv[1:]:
            try:
                print(f"{name}: {described(self.load(Path(name)))}")
            except self.error as exc:
                print(exc, file=sys.stderr)
                status = 1
        return status


def _not_plain(text: str, holds: str) -> tuple[int, str] | None:
    """The first tag, anchor or alias: its line and the refusal."""
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        tagged = isinstance(event, yaml.NodeEvent) and getattr(event, "tag", None) is not None
        if tagged or isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None):
            what = "tags" if tagged else "anchors and aliases"
            return event.start_mark.line + 1, f"{what} are not accepted in {holds}"
    return None


def _located(path: Path, root: yaml.Node | None, error: Any, entry_key: str) -> str:
    """One pydantic error as `file:line: field: problem`, the line read from the YAML node."""
    loc = [part for part in error["loc"] if not str(part).startswith("function-")]
    node, line = root, 1
    for part in loc:
        child = _child(node, part)
        if child is None:
            break
        node, line = child
    field = _field_name(root, loc, entry_key) or "(file)"
    return f"{path}:{line}: {field}: {error['msg']}"


def _duplicate_keys(
    node: yaml.Node | None, where: str, entry_key: str
) -> Iterator[tuple[int, str]]:
    if isinstance(node, yaml.MappingNode):
        seen: set[str] = set()
        for key, value in node.value:
            field = f"{where}.{key.value}" if where else str(key.value)
            if key.value in seen:
                yield key.start_mark.line + 1, field
            seen.add(key.value)
            yield from _duplicate_keys(value, field, entry_key)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            name = _entry_name(node, i, entry_key)
            yield from _duplicate_keys(item, f"{where}[{name or i}]", entry_key)


def _child(node: yaml.Node | None, part: Any) -> tuple[yaml.Node, int] | None:
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            if key.value == str(part):
                return value, key.start_mark.line + 1
    if isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
        item = node.value[part]
        return item, item.start_mark.line + 1
    return None


def _field_name(root: yaml.Node | None, loc: list[Any], entry_key: str) -> str:
    """metrics[3].unit reads `metrics[node_power].unit`: the entry by its `entry_key`."""
    out: list[str] = []
    node = root
    for part in loc:
        if isinstance(part, int):
            name = _entry_name(node, part, entry_key)
            out[-1:] = [f"{out[-1] if out else ''}[{name or part}]"]
        else:
            out.append(str(part))
        child = _child(node, part)
        node = child[0] if child else None
    return ".".join(out)


def _entry_name(node: yaml.Node | None, index: int, entry_key: str) -> str | None:
    if isinstance(node, yaml.SequenceNode) and index < len(node.value):
        found = _child(node.value[index], entry_key)
        if found and isinstance(found[0], yaml.ScalarNode):
            return found[0].value
    return None
