#!/usr/bin/env bash
# Build tests/kubevirt/crds/ (KubeVirt's CRDs printed by KubeVirt's own virt-operator code, at the
# release its go.mod pins) into build/kubevirt/kubevirt-crds; called by .ci/run and by
# tests/support/kubevirt.py. -p 2: CI machines are shared; Go's build cache makes a rebuild a link.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT/tests/kubevirt/crds"
exec go build -p 2 -o "$ROOT/build/kubevirt/kubevirt-crds" .
