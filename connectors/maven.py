"""Jars resolved by Maven from a pom (cached in ~/.m2), remembered per pom content."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import tempfile
from pathlib import Path


def _pom_digest(pom: Path) -> str:
    return hashlib.sha256(pom.read_bytes()).hexdigest()[:16]


def _mvn(pom: Path, *goal: str) -> None:
    if shutil.which("mvn") is None:
        raise RuntimeError("Maven (mvn) is required to resolve the Kafka Connect jars")
    subprocess.run(
        ["mvn", "-q", "-B", "-Dstyle.color=never", "-f", str(pom), *goal, "-DincludeScope=runtime"],
        check=True,
    )


def classpath(pom: Path, cache_dir: Path) -> str:
    """The runtime classpath of `pom`'s dependencies (jars stay in the local Maven cache)."""
    cp_file = cache_dir / f"classpath-{pom.parent.name}-{_pom_digest(pom)}.txt"
    if not cp_file.exists():
        cache_dir.mkdir(parents=True, exist_ok=True)
        _mvn(pom, "dependency:build-classpath", f"-Dmdep.outputFile={cp_file}")
    return cp_file.read_text().strip()


def copy_jars(pom: Path, cache_dir: Path) -> Path:
    """A directory of `pom`'s runtime jars (a plugin directory of Connect's plugin path),
    copied once per version of the pom into `cache_dir`; made aside and renamed into place,
    so that workers starting together never see a half-filled one."""
    dest = cache_dir / f"{pom.parent.name}-{_pom_digest(pom)}"
    if not dest.exists():
        cache_dir.mkdir(parents=True, exist_ok=True)
        partial = Path(tempfile.mkdtemp(prefix=f".{dest.name}-", dir=cache_dir))
        _mvn(pom, "dependency:copy-dependencies", f"-DoutputDirectory={partial}")
        try:
            partial.rename(dest)
        except OSError:  # another worker made it meanwhile
            shutil.rmtree(partial)
    return dest
