#!/bin/sh
# Install the peer systems the benchmark compares jobscope with (Debian packages).
# Idempotent: does nothing when all are already installed. Needs root (or sudo).
set -eu

need=""
command -v victoria-metrics >/dev/null 2>&1 || need="$need victoria-metrics"
[ -x /usr/lib/postgresql/15/bin/postgres ] || need="$need postgresql-15"
[ -x /usr/bin/prometheus-snmp-exporter ] || need="$need prometheus-snmp-exporter"

if [ -z "$need" ]; then
    echo "bench peers already installed: victoria-metrics, postgresql-15, prometheus-snmp-exporter"
    exit 0
fi

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
echo "installing bench peers:$need"
$SUDO apt-get update
# shellcheck disable=SC2086
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y $need
