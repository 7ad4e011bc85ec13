// Command kubevirt-crds prints KubeVirt's CustomResourceDefinitions as a multi-document YAML
// stream, made by KubeVirt's own operator code (virt-operator's generate/components package) at
// the release go.mod pins, so the tests install on the real API server exactly what
// virt-operator installs on a cluster: VirtualMachine, VirtualMachineInstance,
// VirtualMachineInstanceMigration and KubeVirt, with KubeVirt's published validation schemas.
//
//	kubevirt-crds > kubevirt-crds.yaml
//
// Built by .ci/run into build/kubevirt/ (tests/kubevirt/build.sh); used by
// tests/system/test_real_kubevirt.py.
package main

import (
	"fmt"
	"os"

	extv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"kubevirt.io/kubevirt/pkg/virt-operator/resource/generate/components"
	"sigs.k8s.io/yaml"
)

// generators are virt-operator's own constructors, in the order virt-operator creates them.
var generators = []func() (*extv1.CustomResourceDefinition, error){
	components.NewVirtualMachineInstanceCrd,
	components.NewVirtualMachineCrd,
	components.NewVirtualMachineInstanceMigrationCrd,
	components.NewKubeVirtCrd,
}

func main() {
	if len(os.Args) > 1 {
		fmt.Fprintln(os.Stderr, "usage: kubevirt-crds (no arguments): prints KubeVirt's CRDs as YAML")
		os.Exit(2)
	}
	for i, generate := range generators {
		crd, err := generate()
		if err != nil {
			fmt.Fprintln(os.Stderr, "kubevirt-crds:", err)
			os.Exit(1)
		}
		out, err := yaml.Marshal(crd)
		if err != nil {
			fmt.Fprintln(os.Stderr, "kubevirt-crds:", err)
			os.Exit(1)
		}
		if i > 0 {
			fmt.Print("---\n")
		}
		fmt.Print(string(out))
	}
}
