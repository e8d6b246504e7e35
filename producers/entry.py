"""One entry of a devices file: the model every part of the producers shares.

It imports nothing of the producers, so that the arrows run one way: config -> registry ->
plugins -> entry. Whether a URL's scheme has a plugin, and its options, is checked where
the file is loaded (`producers.config.load_devices`), by the plugin itself.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class DeviceEntry(BaseModel):
    """One metric (or family of metrics) of one device: Kwollect's fields, same defaults,
    plus `options` for what Kwollect's URLs cannot say (SNMPv3, table walks, aliases)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(
        pattern=r"^[a-zA-Z_:][a-zA-Z0-9_:]*$",
        description="metric name, Prometheus naming with the unit as suffix",
    )
    device_id: str = Field(min_length=1, description="what is measured: node-1, pdu-3")
    url: str = Field(description="scheme://... selects the plugin; the rest is its config")
    update_every: int = Field(
        10_000, gt=0, strict=True, description="polling period, milliseconds (Kwollect's default)"
    )
    optional: bool = Field(
        False,
        description="Kwollect's on-demand metric: polled only while activated (see ondemand.py)",
    )
    optional_period: int | None = Field(
        None,
        gt=0,
        strict=True,
        description="period (ms) used instead of update_every while the entry is activated "
        "on demand (Kwollect's full monitoring: a wattmeter from 1 Hz to 50 Hz)",
    )
    labels: dict[str, str] = Field(
        default_factory=dict, description="attached to every reading of this entry"
    )
    scale_factor: float | None = Field(
        None, description="every value read is multiplied by it (Kwollect's scale_factor)"
    )
    options: dict[str, Any] = Field(
        default_factory=dict, description="plugin-specific settings, validated by the plugin"
    )
