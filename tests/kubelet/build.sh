#!/usr/bin/env bash
# Build the node side of the e2e tests on the real control plane, the kubelet's own DRA manager
# (tests/kubelet/k8s-X.Y/, k8s.io/kubernetes pkg/kubelet/cm/dra and pkg/kubelet/pluginmanager),
# into build/kubelet/k8s-X.Y/kubelet-dra; called by .ci/run and by tests/support/kubelet_dra.py.
#   tests/kubelet/build.sh [1.37]
# -p 2: CI machines are shared. Most of it is in Go's build cache once the control plane is built.
set -euo pipefail
MINOR=${1:-1.37}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT/tests/kubelet/k8s-$MINOR"
exec go build -p 2 -ldflags "-s -w" -o "$ROOT/build/kubelet/k8s-$MINOR/kubelet-dra" .
