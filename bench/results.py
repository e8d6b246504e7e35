"""Result files: every run of `python -m bench` keeps its figures in
`bench/results/<date>-<commit>-<profile>.json`, with what was run, on which commit (and
whether the tree held uncommitted changes), on which machine, beside which peers' versions.
The docs' figures are generated from those files (`python -m bench.publish`)."""

from __future__ import annotations

import hashlib
import json
import subprocess
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = REPO_ROOT / "bench" / "results"
TREE = (".", ":(exclude)bench/results")  # what a run's commit covers: all but result files
FORMAT = 1  # the layout of a result file: `run`, then the figures as bench-results.json holds them


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(
            ["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def commit() -> dict[str, Any]:
    """The commit measured, the files that differed from it (result files left out: a run's
    own output does not make the next run's tree dirty) and `diff_sha`, the sha256 of their
    `git diff HEAD` (None when clean; untracked files' content is not in it), so that two
    dirty trees changing the same files differ."""
    sha = (_git("rev-parse", "HEAD") or "").strip() or None
    status = _git("status", "--porcelain", "--", *TREE)
    changed = None if status is None else [line[3:] for line in status.splitlines()]
    diff = _git("diff", "HEAD", "--", *TREE) if changed else None
    return {
        "sha": sha,
        "short": sha[:7] if sha else "unknown",
        "dirty": bool(changed) if changed is not None else None,
        "changed_files": changed,
        "diff_sha": None if diff is None else hashlib.sha256(diff.encode()).hexdigest(),
    }


def versions(results: dict[str, Any]) -> dict[str, str]:
    """Every system's and tool's version the run recorded: the storage systems' (`systems.<name>
    .version`) and the polling benchmarks' (`<step>.versions`)."""
    found = {
        name: str(r["version"])
        for name, r in (results.get("systems") or {}).items()
        if isinstance(r, dict) and r.get("version")
    }
    for value in results.values():
        if isinstance(value, dict) and isinstance(value.get("versions"), dict):
            found.update({k: str(v) for k, v in value["versions"].items()})
    return dict(sorted(found.items()))


def profile_label(profile: str, only: list[str] | None) -> str:
    """`quick`, `full`, ...; with --only, the parts run after it: `quick-ipmi+snmp`."""
    return f"{profile}-{'+'.join(sorted(only))}" if only else profile


def write(
    results: dict[str, Any],
    argv: list[str],
    options: dict[str, Any],
    folder: Path = RESULTS_DIR,
    measured: dict[str, Any] | None = None,
) -> Path:
    """Write the result file of a finished run and return its path. `measured`: the commit
    (`commit()`) taken as the run started, the code that ran; the tree may have moved on
    during a long run (`commit_at_end` then says to what). A second run of the same day,
    commit and profile gets `-2`, `-3`, ...: no run overwrites another."""
    now = datetime.now(UTC)
    at_end = commit()
    run = {
        "format": FORMAT,
        "date": now.date().isoformat(),
        "finished_at": now.isoformat(timespec="seconds"),
        "commit": measured or at_end,
        **({"commit_at_end": at_end} if measured and measured != at_end else {}),
        "profile": profile_label(results["profile"], results.get("only")),
        "command": " ".join(["python -m bench", *argv]),
        "options": {k: str(v) if isinstance(v, Path) else v for k, v in options.items()},
        "versions": versions(results),
    }
    sha = run["commit"]["short"] + ("+dirty" if run["commit"]["dirty"] else "")
    stem = f"{run['date']}-{sha}-{run['profile']}"
    folder.mkdir(parents=True, exist_ok=True)
    path, n = folder / f"{stem}.json", 1
    while path.exists():
        n += 1
        path = folder / f"{stem}-{n}.json"
    path.write_text(json.dumps({"run": run, **results}, indent=2, default=str) + "\n")
    return path
