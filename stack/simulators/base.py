"""What every simulator shares: a log file to quote in errors, and use as a context manager."""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from types import TracebackType
from typing import Any, Self


class Simulator(ABC):
    """A simulated device process: `start()` waits until it answers, `stop()` is idempotent."""

    log_file: Path
    """Where the simulator's output goes."""

    @abstractmethod
    def start(self) -> Any:
        """Start, and return once it answers (raise with `log_tail()` otherwise)."""

    @abstractmethod
    def stop(self) -> None:
        """Stop it; safe to call twice."""

    def log_tail(self, lines: int = 20) -> str:
        """The last `lines` lines of its log, for error messages."""
        try:
            return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return "(no log)"

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
