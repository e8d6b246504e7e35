"""The contract between the runtime and a protocol plugin.

A plugin instance serves one device entry. The runtime builds it once with `from_entry`
(which validates the URL and its options, without any I/O), calls `poll` once per tick with
the tick's timestamp, and `close` on shutdown. `poll` must be cancellable: the runtime
cancels a poll that overruns its share of the period.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, ClassVar, Self, TypeVar
from urllib.parse import parse_qsl, urlsplit

from pydantic import BaseModel, ValidationError

if TYPE_CHECKING:
    from producers.entry import DeviceEntry
    from producers.reading import Reading

Options = TypeVar("Options", bound=BaseModel)


class Plugin(ABC):
    scheme: ClassVar[str]
    """The URL scheme the registry maps to this plugin, e.g. `tester` for `tester://`."""

    @classmethod
    @abstractmethod
    def from_entry(cls, entry: DeviceEntry) -> Self:
        """Build the plugin for `entry`; raise ValueError naming what is wrong with it."""

    @abstractmethod
    async def poll(self, timestamp_us: int) -> list[Reading]:
        """Read the device now; every reading carries `timestamp_us`."""

    async def close(self) -> None:  # noqa: B027 (optional hook, nothing to release by default)
        """Release connections and sessions."""


def url_options(url: str, model: type[Options]) -> Options:
    """Validate the query string of `url` against `model` (one value per key)."""
    pairs = parse_qsl(urlsplit(url).query, keep_blank_values=True, strict_parsing=False)
    options: dict[str, str] = {}
    for key, value in pairs:
        if key in options:
            raise ValueError(f"option {key!r} is given twice")
        options[key] = value
    try:
        return model.model_validate(options)
    except ValidationError as exc:
        raise ValueError(validation_message(exc)) from None


def validation_message(exc: ValidationError) -> str:
    """`field: problem` for each error of a pydantic validation, joined by `; `."""
    return "; ".join(
        ": ".join(filter(None, (".".join(str(part) for part in error["loc"]), error["msg"])))
        for error in exc.errors()
    )
