#!/bin/sh
# Install the Debian packages `make up` and `make test` need, when missing (idempotent):
#   Java + Maven         run the Kafka broker
#   snmpd, snmp          a real SNMP agent (v2c and v3) and its command-line tools
#   openipmi, ipmitool   ipmi_sim, a real IPMI 2.0 BMC on LAN (lanplus), and its client
#   freeipmi-tools       ipmi-sensors, which the IPMI plugin runs (as Kwollect does)
#   prometheus-node-exporter  a real Prometheus exporter (stack/simulators/node_exporter.py)
#   prometheus           a real Prometheus remote-writing to the API (stack/simulators/prometheus.py)
#   python3-venv/-gdbm   the separate venv of snmpsim (stack/simulators/snmpsim.py)
#   chromium, chromium-driver  headless browser of the Superset dashboard test (tests/superset/)
#   postgresql-15        OAR's database for the change data capture demo and tests (connectors/)
#   victoria-metrics     the bench's peer, whose load and compaction phases the suite checks
#                        (tests/bench/test_victoriametrics_phases.py)
#   acl                  setfacl: run as root, the ClickHouse server's own account is let through
#                        the folders above a private checkout (stack/services.py)
set -eu

need=""
have() { command -v "$1" >/dev/null 2>&1; }
have java || need="$need default-jre-headless"
have mvn || need="$need maven"
[ -x /usr/sbin/snmpd ] || need="$need snmpd"
have snmpget || need="$need snmp"
have ipmi_sim || need="$need openipmi"
have ipmitool || need="$need ipmitool"
[ -x /usr/sbin/ipmi-sensors ] || have ipmi-sensors || need="$need freeipmi-tools"
[ -x /usr/bin/prometheus-node-exporter ] || need="$need prometheus-node-exporter"
[ -x /usr/bin/prometheus ] || need="$need prometheus"
/usr/bin/python3 -c 'import dbm.gnu, venv, ensurepip' 2>/dev/null || need="$need python3-venv python3-gdbm"
have chromium || need="$need chromium"
have chromedriver || need="$need chromium-driver"
[ -x /usr/lib/postgresql/15/bin/postgres ] || need="$need postgresql-15"
have victoria-metrics || need="$need victoria-metrics"
have setfacl || need="$need acl"

[ -z "$need" ] && exit 0
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
echo "installing Debian packages:$need"
$SUDO apt-get update -qq
# shellcheck disable=SC2086
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends $need
# The package starts a system service on every interface (:9100); jobscope runs its own on
# loopback, so a service installed here is stopped and disabled.
case "$need" in *prometheus-node-exporter*)
    [ ! -d /run/systemd/system ] || $SUDO systemctl disable --now prometheus-node-exporter.service || true ;;
esac
case "$need " in *" prometheus "*)
    [ ! -d /run/systemd/system ] || $SUDO systemctl disable --now prometheus.service || true ;;
esac
# Likewise PostgreSQL's system cluster: connectors/oar_postgres.py runs its own server.
case "$need" in *postgresql-15*)
    [ ! -d /run/systemd/system ] || $SUDO systemctl disable --now postgresql.service || true ;;
esac
