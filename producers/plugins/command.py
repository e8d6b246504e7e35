"""A plugin's command, run once per poll (`ipmi-sensors`, `nvidia-smi`): in a process group
of its own, killed with the whole group (ssh, wrappers) past its timeout or when the runtime
cancels the poll, never left behind."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Sequence

KILL_GRACE_S = 1.0
"""How long past its timeout a command may run before it is killed (ipmi-sensors gives up
by itself at its timeout, with a clearer message than ours)."""


async def run(
    argv: Sequence[str], timeout_s: float, what: str, pass_fds: Sequence[int] = ()
) -> tuple[int, str, str]:
    """Run `argv` to its end: its exit status, standard output and error as text. OSError
    when it cannot start; RuntimeError naming `what` when it outlives `timeout_s`."""
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        pass_fds=pass_fds,
        start_new_session=True,
    )
    try:
        async with asyncio.timeout(timeout_s + KILL_GRACE_S):
            out, err = await proc.communicate()
    except TimeoutError:
        raise RuntimeError(f"{what}: no answer within {timeout_s:g} s, killed") from None
    finally:  # timed out or cancelled by the runtime
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            await asyncio.shield(proc.wait())
    return proc.returncode or 0, out.decode(errors="replace"), err.decode(errors="replace")
