// Command allocator runs the structured DRA allocator of Kubernetes 1.36
// (k8s.io/dynamic-resource-allocation, pinned in go.mod) on JSON requests;
// see package vgpuctl.local/oracle/allocator/oracle.
package main

import (
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/structured"

	"vgpuctl.local/oracle/allocator/oracle"
)

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

// limits are the validation limits of this minor's k8s.io/api resource/v1
// that what the node agent publishes, and what a claim gets, must stay within.
var limits = map[string]int{
	"AllocationResultsMaxSize":                           resourceapi.AllocationResultsMaxSize,
	"BindingConditionsMaxSize":                           resourceapi.BindingConditionsMaxSize,
	"DeviceTaintsMaxLength":                              resourceapi.DeviceTaintsMaxLength,
	"ResourceSliceMaxAttributesAndCapacitiesPerDevice":   resourceapi.ResourceSliceMaxAttributesAndCapacitiesPerDevice,
	"ResourceSliceMaxCounterSets":                        resourceapi.ResourceSliceMaxCounterSets,
	"ResourceSliceMaxCountersPerCounterSet":              resourceapi.ResourceSliceMaxCountersPerCounterSet,
	"ResourceSliceMaxDeviceCounterConsumptionsPerDevice": resourceapi.ResourceSliceMaxDeviceCounterConsumptionsPerDevice,
	"ResourceSliceMaxDevices":                            resourceapi.ResourceSliceMaxDevices,
	"ResourceSliceMaxDevicesWithAdvancedFeatures":        resourceapi.ResourceSliceMaxDevicesWithAdvancedFeatures,
}

func main() {
	oracle.Main(oracle.Minor{Defaults: defaults, Limits: limits, PerNode: structured.ErrFailedAllocationOnNode})
}
