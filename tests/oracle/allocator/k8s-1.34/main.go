// Command allocator runs the structured DRA allocator of Kubernetes 1.34
// (k8s.io/dynamic-resource-allocation, pinned in go.mod) on JSON requests;
// see package vgpuctl.local/oracle/allocator/oracle.
package main

import (
	resourceapi "k8s.io/api/resource/v1"

	"vgpuctl.local/oracle/allocator/oracle"
)

// defaults are the feature gates the allocator acts on, as kube-scheduler
// 1.34 enables them by default: the versioned specs of
// pkg/features/kube_features.go (as of v1.37.2, which keeps each gate's
// history), read at 1.34. 1.34's structured.Features has DeviceBinding and
// DeviceStatus apart (see oracle.gateFields).
var defaults = map[string]bool{
	"DRAAdminAccess":               true,  // beta since 1.34
	"DRAConsumableCapacity":        false, // alpha since 1.34
	"DRADeviceBindingConditions":   false, // alpha since 1.34
	"DRAResourceClaimDeviceStatus": true,  // beta since 1.33
	"DRADeviceTaints":              false, // alpha since 1.33
	"DRAPartitionableDevices":      false, // alpha since 1.33
	"DRAPrioritizedList":           true,  // beta since 1.34
}

// limits are the validation limits of 1.34's k8s.io/api resource/v1. 1.34
// counts counters per slice and per device, summed over sets (1.35 moved to
// per-set limits), and allows 4 taints per device.
var limits = map[string]int{
	"AllocationResultsMaxSize":                         resourceapi.AllocationResultsMaxSize,
	"BindingConditionsMaxSize":                         resourceapi.BindingConditionsMaxSize,
	"DeviceTaintsMaxLength":                            resourceapi.DeviceTaintsMaxLength,
	"ResourceSliceMaxAttributesAndCapacitiesPerDevice": resourceapi.ResourceSliceMaxAttributesAndCapacitiesPerDevice,
	"ResourceSliceMaxSharedCounters":                   resourceapi.ResourceSliceMaxSharedCounters,
	"ResourceSliceMaxCountersPerDevice":                resourceapi.ResourceSliceMaxCountersPerDevice,
	"ResourceSliceMaxDeviceCountersPerSlice":           resourceapi.ResourceSliceMaxDeviceCountersPerSlice,
	"ResourceSliceMaxDevices":                          resourceapi.ResourceSliceMaxDevices,
}

// 1.34 has no structured.ErrFailedAllocationOnNode: every Allocate error
// fails the whole scheduling attempt (PerNode nil).
func main() { oracle.Main(oracle.Minor{Defaults: defaults, Limits: limits}) }
