// Command allocator runs the structured DRA allocator of Kubernetes 1.35
// (k8s.io/dynamic-resource-allocation, pinned in go.mod) on JSON requests;
// see package vgpuctl.local/oracle/allocator/oracle.
package main

import (
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/structured"

	"vgpuctl.local/oracle/allocator/oracle"
)

// defaults are the feature gates the allocator acts on, as kube-scheduler
// 1.35 enables them by default: the versioned specs of
// pkg/features/kube_features.go (as of v1.37.2, which keeps each gate's
// history), read at 1.35. Its structured.Features has no ListTypeAttributes.
var defaults = map[string]bool{
	"DRAAdminAccess":               true,  // beta since 1.34
	"DRAConsumableCapacity":        false, // alpha since 1.34
	"DRADeviceBindingConditions":   false, // alpha since 1.34
	"DRAResourceClaimDeviceStatus": true,  // beta since 1.33
	"DRADeviceTaints":              false, // alpha since 1.33
	"DRAPartitionableDevices":      false, // alpha since 1.33
	"DRAPrioritizedList":           true,  // beta since 1.34
}

// limits are the validation limits of this minor's k8s.io/api resource/v1
// that what the node agent publishes, and what a claim gets, must stay within
// (1.35 names the 64-device limit ...WithTaintsOrConsumesCounters; 1.36
// renamed it ...WithAdvancedFeatures, the key used here for every minor).
var limits = map[string]int{
	"AllocationResultsMaxSize":                           resourceapi.AllocationResultsMaxSize,
	"BindingConditionsMaxSize":                           resourceapi.BindingConditionsMaxSize,
	"DeviceTaintsMaxLength":                              resourceapi.DeviceTaintsMaxLength,
	"ResourceSliceMaxAttributesAndCapacitiesPerDevice":   resourceapi.ResourceSliceMaxAttributesAndCapacitiesPerDevice,
	"ResourceSliceMaxCounterSets":                        resourceapi.ResourceSliceMaxCounterSets,
	"ResourceSliceMaxCountersPerCounterSet":              resourceapi.ResourceSliceMaxCountersPerCounterSet,
	"ResourceSliceMaxDeviceCounterConsumptionsPerDevice": resourceapi.ResourceSliceMaxDeviceCounterConsumptionsPerDevice,
	"ResourceSliceMaxDevices":                            resourceapi.ResourceSliceMaxDevices,
	"ResourceSliceMaxDevicesWithAdvancedFeatures":        resourceapi.ResourceSliceMaxDevicesWithTaintsOrConsumesCounters,
}

func main() {
	oracle.Main(oracle.Minor{Defaults: defaults, Limits: limits, PerNode: structured.ErrFailedAllocationOnNode})
}
