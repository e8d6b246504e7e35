"""The read policy (`JOBSCOPE_READ_POLICY`, docs/access.md) in one place: who may see which
job and which device's readings.

- `open`: anyone reads everything, without a token (Kwollect's model).
- `authenticated`: any valid token reads everything.
- `jobs`: a token is required. `admin`, `support` and `scheduler` read everything; `user`,
  `pusher` and `reader` read the jobs they own (job.user == token's user); `project` its own
  and those of its projects (with `JOBSCOPE_MEMBERS_READ_PROJECT`, every role reading its own
  jobs reads its projects' too); `agent` reads nothing. Device readings outside a visible
  job's nodes and span are for support, admin and scheduler.

A job the caller may not see is filtered out in SQL, so it answers exactly as an unknown job
does (404) and ids cannot be probed. The conditions are SQL with bound parameters (the
`viewer_` ones), never pasted values. Reads of a job by another than its owner are recorded
(api/audit.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Annotated

from clickhouse_connect.driver.client import Client
from fastapi import Depends, Request

from api import audit
from api.infra.config import ApiSettings
from api.infra.errors import Forbidden
from api.infra.tokens import Principal, Role
from api.jobs import get_job
from api.queries.jobs import ALL_JOBS, Condition, covering_job_exists, running_job_on
from api.schemas import Job

READS_ALL = frozenset({Role.ADMIN, Role.SUPPORT, Role.SCHEDULER})
"""Roles reading every job and device under the `jobs` policy."""
READS_OWN = frozenset({Role.USER, Role.PUSHER, Role.READER, Role.PROJECT})
"""Roles reading their own jobs under the `jobs` policy (`agent`: none)."""
OUTSIDE_JOBS = (
    "device readings outside your jobs (their nodes over their span) are for support and admin"
)
_NO_JOB: Condition = ("0", {})


@dataclass(frozen=True)
class Viewer:
    """Who reads, under which policy: None for an anonymous read (the `open` policy)."""

    principal: Principal | None
    policy: str
    members_read_project: bool = False
    recorder: audit.Recorder | None = None
    """Where reads of others' jobs are recorded (None: not recorded)."""
    route: str = ""

    @property
    def sees_all(self) -> bool:
        """Whether every job and device is visible (no filter at all)."""
        who = self.principal
        return self.policy != "jobs" or (who is not None and who.role in READS_ALL)

    def projects(self) -> frozenset[str]:
        """The projects whose jobs this viewer reads besides its own."""
        who = self.principal
        if who is None or who.role not in READS_OWN:
            return frozenset()
        if who.role is Role.PROJECT or self.members_read_project:
            return who.projects
        return frozenset()

    def sees(self, job: Job) -> bool:
        if self.sees_all:
            return True
        who = self.principal
        if who is None or who.role not in READS_OWN:
            return False
        return job.user == who.user or (bool(job.project) and job.project in self.projects())

    def jobs_condition(self) -> Condition:
        """A condition on the `jobs` table keeping the jobs this viewer sees."""
        if self.sees_all:
            return ALL_JOBS
        who = self.principal
        if who is None or who.role not in READS_OWN:
            return _NO_JOB
        projects = sorted(self.projects())
        if not projects:
            return "user = {viewer_user:String}", {"viewer_user": who.user}
        return (
            "(user = {viewer_user:String} OR has({viewer_projects:Array(String)}, project))",
            {"viewer_user": who.user, "viewer_projects": projects},
        )

    def job(self, clickhouse: Client, job_id: str, site: str | None = None) -> Job:
        """The job `job_id` if this viewer sees it (NotFound as for an unknown job otherwise),
        its read recorded when the viewer is not its owner."""
        job = get_job(clickhouse, job_id, site, self.jobs_condition())
        self.record(job)
        return job

    def record(self, job: Job) -> None:
        """Record a read of `job` by another than its owner (an anonymous read is not)."""
        who = self.principal
        if self.recorder is not None and who is not None and who.user != job.user:
            self.recorder.record(who, self.route, job)

    def check_devices(
        self,
        clickhouse: Client,
        devices: tuple[str, ...],
        start: datetime,
        end: datetime,
        site: str | None = None,
    ) -> None:
        """Forbidden unless this viewer sees every device over [start, end]: all of them nodes
        of one visible job whose span holds that range."""
        if self.sees_all:
            return
        visible = self.jobs_condition()
        if not devices or not covering_job_exists(clickhouse, visible, devices, start, end, site):
            raise Forbidden(
                "the devices asked are not all nodes of one of your jobs over the whole time "
                f"asked: {OUTSIDE_JOBS}"
            )

    def check_running_node(self, clickhouse: Client, device: str) -> None:
        """Forbidden unless `device` is a node of a running job this viewer sees."""
        if self.sees_all:
            return
        if not running_job_on(clickhouse, self.jobs_condition(), device):
            raise Forbidden(f"{device!r} is not a node of a running job of yours: {OUTSIDE_JOBS}")


def viewer_of(request: Request) -> Viewer:
    """The viewer of a request, from the principal `auth.reads_guard` kept on its state."""
    app = request.app.state
    settings: ApiSettings = app.settings
    return Viewer(
        principal=getattr(request.state, "principal", None),
        policy=settings.effective_read_policy,
        members_read_project=settings.members_read_project,
        recorder=getattr(app, "audit", None),
        route=getattr(request.scope.get("route"), "path", request.url.path),
    )


async def get_viewer(request: Request) -> Viewer:
    """(async: a sync dependency would take a worker thread)"""
    return viewer_of(request)


ViewerDep = Annotated[Viewer, Depends(get_viewer)]
