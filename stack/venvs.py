"""Side virtual environments for tools whose dependencies would clash with the project's
(snmpsim's pysnmp, Kwollect's collector): built once, reused while nothing they pin changed."""

from __future__ import annotations

import fcntl
import hashlib
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path


def pinned_venv(
    venv: Path,
    requirements: Path,
    python: Path,
    on_built: Callable[[Path], None] | None = None,
    check: bool = True,
) -> Path:
    """`venv`, holding exactly `requirements` (every package pinned: installed with
    --no-deps, then `pip check`), made by `python`. Reused as is while its stamp (digest of
    the requirements, version of the interpreter) matches, rebuilt from scratch otherwise; a
    lock file serialises concurrent builders. `on_built(venv)` runs after a build. `check`
    False skips `pip check`, for a tool that declares dependencies it never imports.
    RuntimeError naming the failed step."""
    stamp_file = venv / ".jobscope-stamp"
    version = subprocess.run(
        [str(python), "-c", "import sys; print(sys.version)"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    digest = hashlib.sha256(requirements.read_bytes()).hexdigest()
    stamp = f"python {version}\nrequirements sha256 {digest}\n"
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(venv.parent / f".{venv.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if stamp_file.exists() and stamp_file.read_text() == stamp:
            return venv
        shutil.rmtree(venv, ignore_errors=True)
        pip = [str(venv / "bin" / "pip"), "--disable-pip-version-check"]
        steps = [
            [str(python), "-m", "venv", str(venv)],
            [*pip, "install", "--quiet", "--no-deps", "-r", str(requirements)],
            *([[*pip, "check"]] if check else []),
        ]
        for argv in steps:
            done = subprocess.run(argv, capture_output=True, text=True)
            if done.returncode != 0:
                shutil.rmtree(venv, ignore_errors=True)
                raise RuntimeError(
                    f"building {venv} failed at `{' '.join(argv)}`:\n"
                    f"{done.stdout[-2000:]}{done.stderr[-2000:]}"
                )
        if on_built is not None:
            on_built(venv)
        stamp_file.write_text(stamp)
        stamp_file.chmod(0o644)
    return venv
