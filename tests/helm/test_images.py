"""The Dockerfiles (helm/images/): no Docker engine runs here, so they are linted with
hadolint and checked for what a build would need: sources that exist, pinned base images, a
non-root user, and an entry point that is a module of the copied sources."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from stack.config import REPO_ROOT
from tests.helm.helm_tools import CHART, IMAGES, venv_tool

DOCKERFILES = sorted(IMAGES.glob("*.Dockerfile"))
PINNED = re.compile(r"^[\w./-]+:\d[\w.-]*$")  # a tag that starts with a version, never latest


def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of a Dockerfile, continuation lines joined."""
    text = re.sub(r"\\\n", " ", path.read_text())
    lines = (line.strip() for line in text.splitlines())
    return [
        (word.upper(), rest.strip())
        for word, _, rest in (line.partition(" ") for line in lines)
        if word and not word.startswith("#")
    ]


def test_one_dockerfile_per_component_the_chart_deploys() -> None:
    names = {p.name.removesuffix(".Dockerfile") for p in DOCKERFILES}
    assert names == {"producers", "api", "migrate", "superset", "connect"}
    values = (CHART / "values.yaml").read_text()
    for name in names:
        assert f"repository: jobscope/{name}" in values


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_hadolint(dockerfile: Path) -> None:
    done = subprocess.run(
        [str(venv_tool("hadolint")), str(dockerfile)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_hadolint_can_fail(tmp_path: Path) -> None:
    bad = tmp_path / "bad.Dockerfile"
    bad.write_text("FROM python:latest\nRUN apt-get install curl\n")
    assert subprocess.run([str(venv_tool("hadolint")), str(bad)], capture_output=True).returncode


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_buildable_from_the_repository_and_non_root(dockerfile: Path) -> None:
    steps = instructions(dockerfile)
    stages = set()
    for word, args in steps:
        if word == "FROM":
            image, _, stage = args.partition(" AS ")
            assert PINNED.match(image), f"{dockerfile.name}: base image {image} is not pinned"
            stages.add(stage.strip())
        if word == "COPY" and not args.startswith("--from="):
            *sources, _ = args.split()
            for source in sources:
                assert (REPO_ROOT / source).exists(), f"{dockerfile.name}: {source} is missing"
        if word == "COPY" and args.startswith("--from="):
            assert args.split()[0].removeprefix("--from=") in stages
    users = [args for word, args in steps if word == "USER"]
    assert users and not users[-1].startswith(("root", "0")), f"{dockerfile.name}: runs as root"
    assert users[-1].split(":")[0] == "10001"  # the chart's runAsUser


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_python_entry_points_are_copied_modules(dockerfile: Path) -> None:
    steps = instructions(dockerfile)
    copied = {Path(args.split()[0]).parts[0] for word, args in steps if word == "COPY"}
    commands = [args for word, args in steps if word in {"ENTRYPOINT", "CMD"}]
    for command in commands:
        match = re.search(r'"-m", "([\w.]+)"', command)
        if match:
            module = match[1].split(".")[0]
            assert module in copied, f"{dockerfile.name}: {module} is not copied"
