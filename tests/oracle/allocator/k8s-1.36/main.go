// Command allocator runs the structured DRA allocator of Kubernetes 1.36
// (k8s.io/dynamic-resource-allocation, pinned in go.mod) on JSON requests;
// see package vgpuctl.local/oracle/allocator/oracle.
package main

import "vgpuctl.local/oracle/allocator/oracle"

// defaults are the feature gates the allocator acts on, as kube-scheduler
// 1.36 enables them by default (pkg/features/kube_features.go, v1.36).
var defaults = map[string]bool{
	"DRAAdminAccess":               true,  // GA
	"DRAConsumableCapacity":        true,  // beta
	"DRADeviceBindingConditions":   true,  // beta
	"DRAResourceClaimDeviceStatus": true,  // beta
	"DRADeviceTaints":              true,  // beta
	"DRAListTypeAttributes":        false, // alpha
	"DRAPartitionableDevices":      true,  // beta
	"DRAPrioritizedList":           true,  // GA
}

func main() { oracle.Main(defaults) }
