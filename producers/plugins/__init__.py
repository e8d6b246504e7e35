"""The plugin registry: URL scheme -> plugin class. The runtime only ever looks plugins up here.

To add a plugin, create `producers/plugins/<protocol>/` (see producers/README.md) and list
its class in `_PLUGINS`.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from producers.plugins.base import Plugin
from producers.plugins.file.plugin import FilePlugin
from producers.plugins.ipmisensor.plugin import IpmiSensorPlugin
from producers.plugins.nvidiasmi.plugin import NvidiaSmiPlugin
from producers.plugins.prometheus.plugin import PrometheusPlugin
from producers.plugins.snmp.plugin import SnmpPlugin
from producers.plugins.tester.plugin import TesterPlugin
from producers.plugins.wattmeter.plugin import WattmeterPlugin

_PLUGINS: tuple[type[Plugin], ...] = (
    FilePlugin,
    IpmiSensorPlugin,
    NvidiaSmiPlugin,
    PrometheusPlugin,
    SnmpPlugin,
    TesterPlugin,
    WattmeterPlugin,
)
PLUGINS: dict[str, type[Plugin]] = {plugin.scheme: plugin for plugin in _PLUGINS}


def plugin_for(url: str) -> type[Plugin]:
    """The plugin class serving `url`; ValueError for an unknown scheme."""
    scheme = urlsplit(url).scheme
    try:
        return PLUGINS[scheme]
    except KeyError:
        known = ", ".join(f"{name}://" for name in sorted(PLUGINS))
        raise ValueError(
            f"unknown scheme {scheme + '://' if scheme else '(none)'}; known: {known}"
        ) from None
