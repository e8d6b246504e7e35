"""The metric registry (api/registry.py): every entry and the site's energy priority, or one
metric's resolved entry. Readable as the catalog: no job data, only what metrics are."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from api.registry import MetricInfo, Registry, registry

router = APIRouter(prefix="/api/metrics", tags=["metrics"])


@router.get(
    "/registry",
    operation_id="get_metric_registry",
    response_model=Registry | MetricInfo,
    summary="The metric registry, or one metric's entry",
)
def get_registry(
    metric: Annotated[
        str | None,
        Query(
            min_length=1,
            max_length=256,
            description="a metric_id: its entry (exact, else the first matching pattern, else "
            "inferred from the name: `inferred: true`) instead of the whole registry",
            examples=["bmc_node_power_watt"],
        ),
    ] = None,
) -> Registry | MetricInfo:
    """The registry (`energy_priority`, `metrics`), or with `metric=` the entry that
    describes it, `name` being the entry's own name or pattern."""
    return registry() if metric is None else registry().lookup(metric)
