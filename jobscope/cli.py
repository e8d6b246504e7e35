"""`jobscope`: a job's readings to a file, jobs and summaries as tables, pushes and tokens.

The API is `--api` or $JOBSCOPE_API (default http://127.0.0.1:8000); the token `--token` or
$JOBSCOPE_TOKEN, else the one `jobscope login` stored for the API. Every failure is one line
on stderr and a non-zero exit status.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable
from typing import IO, Any

import click
from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TransferSpeedColumn,
)
from rich.table import Table

from jobscope import credentials
from jobscope.client import DEFAULT_API, REPORT_FORMATS, ApiError, Client, token_id
from jobscope.login import claims
from jobscope.login import login as sign_in
from jobscope.login import logout as sign_out

EXPORT_FORMATS = ("csv", "parquet", "ndjson")
JOB_COLUMNS = ("job_id", "user", "state", "queue", "nodes", "start", "end")


def _client(ctx: click.Context) -> Client:
    client: Client = ctx.obj
    return client


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--api",
    envvar="JOBSCOPE_API",
    default=DEFAULT_API,
    show_default=True,
    help="the API's base URL [env: JOBSCOPE_API]",
)
@click.option(
    "--token",
    envvar="JOBSCOPE_TOKEN",
    default=None,
    help="bearer token [env: JOBSCOPE_TOKEN; default: the one `jobscope login` stored]",
)
@click.pass_context
def cli(ctx: click.Context, api: str, token: str | None) -> None:
    """jobscope's command line: job-scoped metrics from a jobscope API."""
    ctx.obj = ctx.with_resource(Client(api, token))


@cli.command()
@click.option("--job", help="the job whose scope is exported")
@click.option("--devices", help="comma-separated devices (without --job: required by the API)")
@click.option("--metrics", help="comma-separated metric ids or globs, e.g. 'bmc_*'")
@click.option("--start-time", help="ISO 8601 or Unix seconds")
@click.option("--end-time", help="ISO 8601 or Unix seconds")
@click.option("--step", help="aggregate by buckets of this duration: 10s, 1m, 1h")
@click.option("--agg", help="aggregate of each bucket (with --step): avg, max, ...")
@click.option(
    "--format", "fmt", type=click.Choice(EXPORT_FORMATS), default="csv", show_default=True
)
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, allow_dash=True),
    default="-",
    help="the file written (default: stdout)",
)
@click.pass_context
def get(
    ctx: click.Context,
    job: str | None,
    devices: str | None,
    metrics: str | None,
    start_time: str | None,
    end_time: str | None,
    step: str | None,
    agg: str | None,
    fmt: str,
    output: str,
) -> None:
    """Readings of a job (or devices) streamed to a file."""
    if job is None and devices is None:
        raise click.UsageError("give --job or --devices")
    query: dict[str, Any] = dict(
        job=job,
        devices=devices,
        metrics=metrics,
        start_time=start_time,
        end_time=end_time,
        step=step,
        agg=agg,
        format=fmt,
    )
    with _client(ctx).readings(**query) as response:
        if output == "-":
            _copy(response.iter_bytes(), sys.stdout.buffer, fmt, show=False)
        else:
            with open(output, "wb") as out:
                _copy(response.iter_bytes(), out, fmt, show=_stderr().is_terminal)


def _stderr() -> Console:
    return Console(stderr=True)


def _copy(chunks: Iterable[bytes], out: IO[bytes], fmt: str, show: bool) -> None:
    """Write the body as it comes; on a terminal, with bytes (and, for text formats,
    readings: one per line) counted."""
    text = fmt != "parquet"
    columns = [
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TextColumn("{task.fields[readings]}"),
        TimeElapsedColumn(),
    ]
    with Progress(*columns, console=_stderr(), disable=not show, transient=False) as progress:
        task = progress.add_task("export", total=None, readings="")
        lines = 0
        for chunk in chunks:
            out.write(chunk)
            if text:
                lines += chunk.count(b"\n")
            readings = max(lines - 1, 0) if fmt == "csv" else lines
            progress.update(
                task, advance=len(chunk), readings=f"{readings:,} readings" if text else ""
            )


@cli.command()
@click.option("--user")
@click.option("--state", help="running, terminated, ...")
@click.option("--node", help="jobs that ran on this node")
@click.option("--limit", type=int, default=50, show_default=True)
@click.pass_context
def jobs(
    ctx: click.Context, user: str | None, state: str | None, node: str | None, limit: int
) -> None:
    """Jobs, newest first, as a table."""
    frame = _client(ctx).jobs(user=user, state=state, node=node, limit=limit)
    table = Table(*JOB_COLUMNS)
    for row in frame.to_dict("records") if len(frame) else []:
        table.add_row(*(_cell(row.get(c)) for c in JOB_COLUMNS))
    Console().print(table)


@cli.command()
@click.argument("jobs", nargs=-1, required=True)
@click.option("--json", "as_json", is_flag=True, help="the API's answer as JSON")
@click.pass_context
def compare(ctx: click.Context, jobs: tuple[str, ...], as_json: bool) -> None:
    """Jobs side by side (`jobscope compare A B C`): one row per figure, a column per job,
    and for every job after the first its difference to the first, relative."""
    if len(jobs) < 2:
        raise click.BadParameter("give at least two jobs", param_hint="JOBS")
    result = _client(ctx).compare(*jobs)
    if as_json:
        click.echo(json.dumps(result, indent=2))
        return
    rows = result["jobs"]
    table = Table("figure", *(_job_heading(row, i) for i, row in enumerate(rows)))
    for name in result["figures"]:
        table.add_row(name, *(_compared_cell(row, name) for row in rows))
    table.add_row("notes", *(", ".join(n["id"] for n in row["notes"]) or "-" for row in rows))
    Console().print(table)


def _job_heading(row: dict[str, Any], index: int) -> str:
    return f"{row['job']['job_id']}" + (" (reference)" if index == 0 else "")


def _compared_cell(row: dict[str, Any], name: str) -> str:
    value = _cell(row["figures"].get(name))
    relative = (row.get("diff") or {}).get(name, {}).get("relative")
    return f"{value} ({relative:+.1%})" if relative is not None else value


@cli.command()
@click.argument("job")
@click.option("--metrics", help="comma-separated metric ids or globs")
@click.pass_context
def summary(ctx: click.Context, job: str, metrics: str | None) -> None:
    """A job's statistics per device and metric, and its energy, as tables."""
    result = _client(ctx).summary(job, metrics)
    console = Console()
    console.print(
        f"job {result['job_id']}: {result.get('start')} .. {result.get('end')} "
        f"({result.get('duration_s', 0):.0f} s)"
    )
    stats = Table("device_id", "metric_id", "min", "avg", "max", "last", "count", title="metrics")
    for m in result.get("metrics", []):
        stats.add_row(
            m["device_id"],
            m["metric_id"],
            *(_cell(m.get(k)) for k in ("min", "avg", "max", "last", "count")),
        )
    console.print(stats)
    energy = result.get("energy", [])
    if energy:
        keys = [k for k in energy[0] if k not in ("node",)]
        table = Table("node", *keys, title="energy (J)")
        for e in energy:
            table.add_row(_cell(e.get("node")), *(_cell(e.get(k)) for k in keys))
        console.print(table)
    totals = result.get("energy_total", [])
    if totals:
        keys = list(totals[0])
        table = Table(*keys, title="energy total (J)")
        for t in totals:
            table.add_row(*(_cell(t.get(k)) for k in keys))
        console.print(table)


REGISTRY_COLUMNS = ("name", "unit", "kind", "scope", "node_aggregation", "energy_role", "key")


@cli.command()
@click.argument("metric", required=False)
@click.pass_context
def registry(ctx: click.Context, metric: str | None) -> None:
    """The metric registry as a table, or the entry describing METRIC (every field)."""
    console = Console()
    if metric:
        entry = _client(ctx).registry(metric)
        table = Table("field", "value", title=f"{metric}")
        for key, value in entry.items():
            table.add_row(key, _cell(value))
        console.print(table)
        return
    result = _client(ctx).registry()
    console.print(f"energy priority: {', '.join(result['energy_priority'])}")
    table = Table(*REGISTRY_COLUMNS, title="metrics")
    for entry in result["metrics"]:
        table.add_row(*(_cell(entry.get(c)) for c in REGISTRY_COLUMNS))
    console.print(table)


@cli.command()
@click.argument("job")
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, allow_dash=True),
    default="-",
    help="the file written (default: stdout); its suffix picks the format",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(REPORT_FORMATS),
    help="html, pdf, md or json (default: from the suffix of -o, else html)",
)
@click.pass_context
def report(ctx: click.Context, job: str, output: str, fmt: str | None) -> None:
    """A job's report (metadata, energy, footprint and notes, plots), e.g.
    `jobscope report 4242 -o report.pdf`."""
    if fmt is None:
        suffix = output.rsplit(".", 1)[-1].lower() if "." in output else ""
        fmt = {"htm": "html", "markdown": "md"}.get(suffix, suffix)
        if fmt not in REPORT_FORMATS:
            if output != "-":
                raise click.UsageError(
                    f"cannot tell the format from {output!r}: give --format "
                    f"({', '.join(REPORT_FORMATS)})"
                )
            fmt = "html"
    body = _client(ctx).report(job, fmt)
    if output == "-":
        sys.stdout.buffer.write(body)
        sys.stdout.buffer.flush()
        return
    with open(output, "wb") as out:
        out.write(body)
    click.echo(f"report of job {job} written to {output} ({len(body):,} bytes)", err=True)


@cli.command()
@click.option("--job", required=True, help="the job whose readings are followed")
@click.option("--metrics", help="comma-separated metric ids or globs, e.g. 'wattmetre_*'")
@click.option("--devices", help="keep these devices of the job's scope")
@click.option("--since", help="replay the job's readings from then first (ISO 8601 or Unix s)")
@click.option(
    "--format", "fmt", type=click.Choice(("table", "ndjson")), default="table", show_default=True
)
@click.pass_context
def tail(
    ctx: click.Context,
    job: str,
    metrics: str | None,
    devices: str | None,
    since: str | None,
    fmt: str,
) -> None:
    """A job's readings as they arrive, until the job ends (Ctrl-C stops earlier)."""
    readings = _client(ctx).live(job, metrics=metrics, devices=devices, since=since, frames=False)
    out = sys.stdout
    try:
        for reading in readings:
            out.write(json.dumps(reading) + "\n" if fmt == "ndjson" else _tail_line(reading))
            out.flush()
    except KeyboardInterrupt:
        sys.exit(130)
    click.echo(f"job {job} has ended", err=True)


def _tail_line(reading: dict[str, Any]) -> str:
    """One reading on one line: time (UTC, to the millisecond), device, metric, value, labels."""
    labels = " ".join(f"{k}={v}" for k, v in reading["labels"].items())
    when = reading["timestamp"][:23].replace("T", " ")
    return (
        f"{when}  {reading['device_id']:<14} {reading['metric_id']:<32} "
        f"{_cell(float(reading['value'])):>12}  {labels}\n"
    )


@cli.command()
@click.argument("source", type=click.File("rb"), default="-")
@click.pass_context
def push(ctx: click.Context, source: IO[bytes]) -> None:
    """Readings from SOURCE (a file, or - for stdin; NDJSON or a JSON array) to the API."""
    body = source.read()
    if body.lstrip().startswith(b"["):
        try:
            rows = json.loads(body)
        except ValueError as exc:
            raise click.ClickException(f"{source.name}: not a JSON array: {exc}") from None
        body = b"".join(json.dumps(r).encode() + b"\n" for r in rows)
    count = _client(ctx).push_ndjson(body)
    click.echo(f"{count} readings accepted")


@cli.command()
@click.pass_context
def login(ctx: click.Context) -> None:
    """Log in at the API's identity provider (in a browser, anywhere): later commands and
    the Python client use the token, refreshed as needed, until `jobscope logout`."""
    api = _client(ctx).url
    stored = sign_in(api, lambda line: click.echo(line, err=True))
    said = claims(stored.access_token)
    who = said.get("preferred_username") or said.get("sub") or "you"
    click.echo(f"logged in to {api} as {who} (token stored in {credentials.folder()})", err=True)


@cli.command()
@click.pass_context
def logout(ctx: click.Context) -> None:
    """Forget the token `jobscope login` stored for the API, and revoke it at the provider."""
    api = _client(ctx).url
    had, unrevoked = sign_out(api)
    if not had:
        click.echo(f"not logged in to {api}", err=True)
        return
    click.echo(f"logged out of {api}", err=True)
    if unrevoked:
        click.echo(f"jobscope: the login could not be revoked: {unrevoked}", err=True)


@cli.group()
def token() -> None:
    """API tokens (an admin token is needed)."""


@token.command("create")
@click.option("--user", required=True)
@click.option(
    "--role",
    required=True,
    help="user, project, support, agent, reader, pusher, scheduler or admin",
)
@click.option("--ttl-days", type=int, help="validity (the API's default if absent)")
@click.option(
    "--project", "projects", multiple=True, help="a project whose jobs it reads (repeatable)"
)
@click.option("--node", "nodes", multiple=True, help="a node an agent pushes for (repeatable)")
@click.pass_context
def token_create(
    ctx: click.Context,
    user: str,
    role: str,
    ttl_days: int | None,
    projects: tuple[str, ...],
    nodes: tuple[str, ...],
) -> None:
    """Create a token and print it (alone on stdout, for scripts)."""
    created = _client(ctx).create_token(user, role, ttl_days, projects, nodes)
    click.echo(created["token"])


@token.command("revoke")
@click.argument("token_or_jti")
@click.pass_context
def token_revoke(ctx: click.Context, token_or_jti: str) -> None:
    """Revoke a signed token, given whole or by its id (jti): every API replica refuses it."""
    jti = token_or_jti
    if token_or_jti.count(".") == 2:  # a whole token: its id is in its claims
        try:
            jti = token_id(token_or_jti)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="TOKEN_OR_JTI") from None
    answer = _client(ctx).revoke_token(jti)
    click.echo(f"token {answer['jti']} revoked (kept until {answer['kept_until']})")


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, list):
        return ",".join(map(str, value))
    return str(value)


def main() -> None:
    """The console script: ApiErrors (and a missing output directory) as one line, exit 1."""
    try:
        cli.main(standalone_mode=False)
    except click.exceptions.Abort:
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except (ApiError, OSError) as exc:
        click.echo(f"jobscope: {exc}", err=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
