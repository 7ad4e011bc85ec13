#!/usr/bin/env bash
# Build the real control plane of one Kubernetes version (tests/controlplane/k8s-X.Y/) into
# build/controlplane/k8s-X.Y/controlplane; called by .ci/run and by tests/support/controlplane.py.
#   tests/controlplane/build.sh [1.37 | 1.34]
# The version kube-apiserver reports (/version, what kubectl and vgpuctl doctor read) is the
# k8s.io/kubernetes module's, stamped as Kubernetes' own build does (-X ...component-base/version).
# -p 2: CI machines are shared. Go's build cache makes a rebuild take seconds (a link, ~1 min).
set -euo pipefail
MINOR=${1:-1.37}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT/tests/controlplane/k8s-$MINOR"
v=$(go list -m -f '{{.Version}}' k8s.io/kubernetes)   # v1.37.2
major=${v#v}; major=${major%%.*}
minor=${v#v*.}; minor=${minor%%.*}
pkg=k8s.io/component-base/version
exec go build -p 2 \
  -ldflags "-s -w -X $pkg.gitVersion=$v -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z" \
  -o "$ROOT/build/controlplane/k8s-$MINOR/controlplane" .
