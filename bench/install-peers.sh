#!/bin/sh
# Install the peer systems the benchmark compares jobscope with (Debian packages).
# Idempotent: does nothing when all are already installed. Needs root (or sudo).
set -eu

need=""
command -v victoria-metrics >/dev/null 2>&1 || need="$need victoria-metrics"
[ -x /usr/lib/postgresql/15/bin/postgres ] || need="$need postgresql-15"
[ -x /usr/bin/prometheus-snmp-exporter ] || need="$need prometheus-snmp-exporter"
[ -x /usr/bin/prometheus ] || need="$need prometheus"

if [ -z "$need" ]; then
    echo "bench peers already installed: victoria-metrics, postgresql-15, prometheus-snmp-exporter, prometheus"
    exit 0
fi

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
echo "installing bench peers:$need"
$SUDO apt-get update
# shellcheck disable=SC2086
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y $need
# The prometheus package starts a system service on every interface (:9090); the benchmark
# runs its own on loopback, so a service installed here is stopped and disabled.
case "$need " in *" prometheus "*)
    [ ! -d /run/systemd/system ] || $SUDO systemctl disable --now prometheus.service || true ;;
esac
