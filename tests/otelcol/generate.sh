#!/usr/bin/env bash
# Regenerate the collector's sources (main*.go, components.go, go.mod, go.sum) from
# builder-config.yaml with the OpenTelemetry Collector Builder (ocb) of the same release,
# itself a Go module. Run it after changing builder-config.yaml, then commit what it wrote.
# `generate.sh DIR` writes them into DIR instead (tests/api/test_otel_collector.py diffs them).
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=versions.env
. "$HERE/versions.env"
cd "$HERE"
go run "go.opentelemetry.io/collector/cmd/builder@$OTELCOL_VERSION" \
	--config builder-config.yaml --skip-compilation --output-path "${1:-.}"
