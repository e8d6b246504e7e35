#!/usr/bin/env bash
# Tools the chart tests need, built once and cached outside the repo, keyed by version:
# helm (go install), kube-apiserver and etcd (helm/tools/*: Go modules pinned by go.sum),
# and kubernetes-validate in its own venv (.venv-helm, pins in helm/requirements.txt).
# Go keeps its module and build caches where it always does. Idempotent; seconds when cached.
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=tools/versions.env
. "$HERE/tools/versions.env"
BIN="${JOBSCOPE_TOOLS_BIN:-${XDG_CACHE_HOME:-$HOME/.cache}/jobscope/bin}"
VENV="$HERE/../.venv-helm"
mkdir -p "$BIN"

command -v go >/dev/null || { echo "install-tools: Go is required (https://go.dev/doc/install)" >&2; exit 1; }

# build NAME-VERSION WORKDIR [LDFLAGS]: one `go build` into the cache, atomically renamed.
build() {
	local target="$BIN/$1"
	[ -x "$target" ] && return 0
	echo "install-tools: building $1 (minutes on a cold Go cache)"
	local start=$SECONDS
	(cd "$2" && go build -trimpath -ldflags "${3:-}" -o "$target.tmp" .)
	mv "$target.tmp" "$target"
	echo "install-tools: $1 built in $((SECONDS - start)) s"
}

if [ ! -x "$BIN/helm-$HELM_VERSION" ]; then
	start=$SECONDS
	echo "install-tools: building helm-$HELM_VERSION (minutes on a cold Go cache)"
	tmp="$(mktemp -d)"
	GOBIN="$tmp" go install "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
	mv "$tmp/helm" "$BIN/helm-$HELM_VERSION"
	rmdir "$tmp"
	echo "install-tools: helm-$HELM_VERSION built in $((SECONDS - start)) s"
fi
build "etcd-$ETCD_VERSION" "$HERE/tools/etcd"
# The version the server reports (helm checks a chart's kubeVersion against it), as
# Kubernetes' own release build stamps it.
major="${KUBE_VERSION#v}" && minor="${major#*.}"
build "kube-apiserver-$KUBE_VERSION" "$HERE/tools/kube-apiserver" "$(printf -- '-X k8s.io/component-base/version.%s ' \
	"gitVersion=$KUBE_VERSION" "gitMajor=${major%%.*}" "gitMinor=${minor%%.*}" "gitTreeState=clean")"

STAMP="$VENV/.installed-$(sha256sum "$HERE/requirements.txt" | cut -c1-12)"
if [ ! -f "$STAMP" ]; then
	python3 -m venv "$VENV"
	"$VENV/bin/pip" install -q --disable-pip-version-check -r "$HERE/requirements.txt"
	rm -f "$VENV"/.installed-* && touch "$STAMP"
fi
