// Package oracle runs Kubernetes' own structured DRA allocator
// (k8s.io/dynamic-resource-allocation/structured) on JSON requests read from
// stdin, one per line, and writes one JSON answer per line to stdout. It is
// the oracle the Python scheduler model (dra_bridge/scheduling) is compared
// with; see tests/support/upstream_allocator.py.
//
// The code here only wires inputs to the upstream API: which upstream release
// runs is decided by the go.mod of the small main package per Kubernetes
// minor (../k8s-1.34 .. ../k8s-1.37), which also names the feature gates that
// minor's kube-scheduler enables by default and the validation limits of its
// k8s.io/api (constants that not every release has).
package oracle

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"reflect"
	"runtime/debug"
	"sort"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"
)

// Request is one allocation attempt: the cluster state the scheduler sees and
// one pod's claims.
type Request struct {
	ID string `json:"id,omitempty"`
	// Slices as the scheduler sees them (DeviceTaintRules already applied).
	Slices  []*resourceapi.ResourceSlice `json:"slices"`
	Classes []*resourceapi.DeviceClass   `json:"classes"`
	// Allocated are claims with status.allocation: what they hold is in use.
	Allocated []*resourceapi.ResourceClaim `json:"allocated"`
	// Node is the node to allocate on; NodeName is a shortcut for a node
	// without labels.
	Node     *v1.Node `json:"node,omitempty"`
	NodeName string   `json:"nodeName,omitempty"`
	// Claims are the pod's claims still to allocate.
	Claims []*resourceapi.ResourceClaim `json:"claims"`
	// Gates flips Kubernetes feature gates (by their Kubernetes name) from
	// the defaults of this minor's kube-scheduler.
	Gates map[string]bool `json:"gates,omitempty"`
	// TimeoutSeconds bounds one Allocate call (default 30).
	TimeoutSeconds float64 `json:"timeoutSeconds,omitempty"`
}

// Answer is the outcome of one Request. Status is "allocated" (Allocations
// holds one result per claim, in order), "unschedulable" (Allocate returned
// nil, nil: the claims do not fit on this node) or "error" (Error holds the
// text; PerNode says whether it wraps ErrFailedAllocationOnNode, which makes
// it about this node only instead of the whole scheduling attempt).
type Answer struct {
	ID          string                         `json:"id,omitempty"`
	Status      string                         `json:"status"`
	Allocations []resourceapi.AllocationResult `json:"allocations,omitempty"`
	Error       string                         `json:"error,omitempty"`
	PerNode     bool                           `json:"perNode,omitempty"`
	// Features are the structured.Features the allocator ran with.
	Features map[string]bool `json:"features"`
	// Version is the k8s.io/dynamic-resource-allocation release.
	Version string `json:"version"`
}

// gateFields maps each Kubernetes feature gate the allocator acts on to the
// structured.Features field it sets, the first of the candidates that this
// release's Features has: 1.34 has DeviceBinding and DeviceStatus apart, 1.35
// on one DeviceBindingAndStatus that needs both DRADeviceBindingConditions and
// DRAResourceClaimDeviceStatus, as kube-scheduler sets it (each release's
// structured/internal/types.go, Features.Set).
var gateFields = map[string][]string{
	"DRAAdminAccess":               {"AdminAccess"},
	"DRADeviceCompatibilityGroups": {"CompatibilityGroups"},
	"DRAConsumableCapacity":        {"ConsumableCapacity"},
	"DRADerivedAttributes":         {"DerivedAttributes"},
	"DRADeviceBindingConditions":   {"DeviceBindingAndStatus", "DeviceBinding"},
	"DRAResourceClaimDeviceStatus": {"DeviceBindingAndStatus", "DeviceStatus"},
	"DRADeviceTaints":              {"DeviceTaints"},
	"DRAFractionalCapacityRange":   {"FractionalCapacityRange"},
	"DRAListTypeAttributes":        {"ListTypeAttributes"},
	"DRAOptionalNodeOperations":    {"OptionalNodeOperations"},
	"DRAPartitionableDevices":      {"PartitionableDevices"},
	"DRAPrioritizedList":           {"PrioritizedList"},
}

// features turns the gates (defaults overridden by flips) into the
// structured.Features of the linked release. Fields are set by name, so one
// source serves releases whose Features differ; a gate this release's
// allocator does not know is an error rather than silently ignored.
func features(defaults, flips map[string]bool) (structured.Features, error) {
	gates := map[string]bool{}
	for name, on := range defaults {
		gates[name] = on
	}
	for name, on := range flips {
		if _, known := defaults[name]; !known {
			return structured.Features{}, fmt.Errorf("feature gate %q is not a gate of this minor's allocator", name)
		}
		gates[name] = on
	}
	var f structured.Features
	v := reflect.ValueOf(&f).Elem()
	set := map[string]bool{}
	for name, on := range gates {
		candidates, ok := gateFields[name]
		if !ok {
			return f, fmt.Errorf("feature gate %q has no allocator feature", name)
		}
		var fv reflect.Value
		field := ""
		for _, field = range candidates {
			if fv = v.FieldByName(field); fv.IsValid() {
				break
			}
		}
		if !fv.IsValid() {
			return f, fmt.Errorf("feature gate %q: structured.Features has none of %v in this release", name, candidates)
		}
		if prev, seen := set[field]; seen {
			on = on && prev
		}
		set[field] = on
		fv.SetBool(on)
	}
	return f, nil
}

func featureMap(f structured.Features) map[string]bool {
	out := map[string]bool{}
	v := reflect.ValueOf(f)
	for i := 0; i < v.NumField(); i++ {
		if v.Field(i).Kind() == reflect.Bool {
			out[v.Type().Field(i).Name] = v.Field(i).Bool()
		}
	}
	return out
}

// celFeatures sets the cel.Features fields named Enable<Field> from the
// allocator features, as kube-scheduler does for ConsumableCapacity and
// ListTypeAttributes.
func celFeatures(f structured.Features) cel.Features {
	var cf cel.Features
	cv := reflect.ValueOf(&cf).Elem()
	fv := reflect.ValueOf(f)
	for i := 0; i < cv.NumField(); i++ {
		name := cv.Type().Field(i).Name
		if src := fv.FieldByName(name[len("Enable"):]); src.IsValid() && src.Kind() == reflect.Bool {
			cv.Field(i).SetBool(src.Bool())
		}
	}
	return cf
}

// allocatedState is what kube-scheduler's claim tracker gathers from the
// allocated claims: devices held (admin access holds nothing), and with
// consumable capacity the shares of devices that allow several allocations.
func allocatedState(claims []*resourceapi.ResourceClaim, consumable bool) structured.AllocatedState {
	state := structured.AllocatedState{
		AllocatedDevices:         sets.New[structured.DeviceID](),
		AllocatedSharedDeviceIDs: sets.New[structured.SharedDeviceID](),
		AggregatedCapacity:       structured.NewConsumedCapacityCollection(),
	}
	for _, claim := range claims {
		if claim == nil || claim.Status.Allocation == nil {
			continue
		}
		for _, r := range claim.Status.Allocation.Devices.Results {
			if r.AdminAccess != nil && *r.AdminAccess {
				continue
			}
			id := structured.MakeDeviceID(r.Driver, r.Pool, r.Device)
			if consumable && r.ShareID != nil {
				state.AllocatedSharedDeviceIDs.Insert(structured.MakeSharedDeviceID(id, r.ShareID))
				if r.ConsumedCapacity != nil {
					state.AggregatedCapacity.Insert(structured.NewDeviceConsumedCapacity(id, r.ConsumedCapacity))
				}
				continue
			}
			state.AllocatedDevices.Insert(id)
		}
	}
	return state
}

// applyDefaults sets what the API server defaults when it stores a claim
// (SetDefaults_ExactDeviceRequest, SetDefaults_DeviceSubRequest and
// SetDefaults_DeviceToleration of pkg/apis/resource/v1): the allocator is
// given claims as the API holds them, and the project's rendered templates
// leave these fields to the server.
func applyDefaults(claim *resourceapi.ResourceClaim) {
	if claim == nil {
		return
	}
	mode := func(m *resourceapi.DeviceAllocationMode, count *int64) {
		if *m == "" {
			*m = resourceapi.DeviceAllocationModeExactCount
		}
		if *m == resourceapi.DeviceAllocationModeExactCount && *count == 0 {
			*count = 1
		}
	}
	tolerations := func(ts []resourceapi.DeviceToleration) {
		for i := range ts {
			if ts[i].Operator == "" {
				ts[i].Operator = resourceapi.DeviceTolerationOpEqual
			}
		}
	}
	for i := range claim.Spec.Devices.Requests {
		r := &claim.Spec.Devices.Requests[i]
		if r.Exactly != nil {
			mode(&r.Exactly.AllocationMode, &r.Exactly.Count)
			tolerations(r.Exactly.Tolerations)
		}
		for j := range r.FirstAvailable {
			sub := &r.FirstAvailable[j]
			mode(&sub.AllocationMode, &sub.Count)
			tolerations(sub.Tolerations)
		}
	}
}

// classes is a structured.DeviceClassLister over the request's classes.
type classes []*resourceapi.DeviceClass

func (c classes) List() ([]*resourceapi.DeviceClass, error) { return c, nil }

func (c classes) Get(name string) (*resourceapi.DeviceClass, error) {
	for _, class := range c {
		if class.Name == name {
			return class, nil
		}
	}
	return nil, fmt.Errorf("device class %s does not exist", name)
}

// celCaches keeps one compiled-expression cache per CEL feature set, shared by
// all requests of a stream like the scheduler shares one.
var celCaches = map[cel.Features]*cel.Cache{}

// Run answers one request.
func Run(ctx context.Context, m Minor, version string, req *Request) Answer {
	out := Answer{ID: req.ID, Version: version}
	f, err := features(m.Defaults, req.Gates)
	out.Features = featureMap(f)
	if err != nil {
		out.Status, out.Error = "error", "oracle: "+err.Error()
		return out
	}
	for _, claim := range req.Claims {
		applyDefaults(claim)
	}
	node := req.Node
	if node == nil {
		node = &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: req.NodeName}}
	}
	cf := celFeatures(f)
	cache := celCaches[cf]
	if cache == nil {
		cache = cel.NewCache(1000, cf)
		celCaches[cf] = cache
	}
	timeout := 30 * time.Second
	if req.TimeoutSeconds > 0 {
		timeout = time.Duration(req.TimeoutSeconds * float64(time.Second))
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	alloc, err := structured.NewAllocator(ctx, f, allocatedState(req.Allocated, f.ConsumableCapacity), classes(req.Classes), req.Slices, cache)
	if err == nil {
		var results []resourceapi.AllocationResult
		results, err = alloc.Allocate(ctx, node, req.Claims)
		if err == nil {
			if results == nil {
				out.Status = "unschedulable"
			} else {
				out.Status, out.Allocations = "allocated", results
			}
			return out
		}
	}
	out.Status, out.Error = "error", err.Error()
	out.PerNode = m.PerNode != nil && errors.Is(err, m.PerNode)
	return out
}

// Minor is what differs between the per-minor programs beyond the linked
// release: kept in each main package because the names it refers to are not in
// every release.
type Minor struct {
	// Defaults are the gates the allocator acts on, as this minor's
	// kube-scheduler has them by default.
	Defaults map[string]bool
	// Limits are the validation limits of the linked k8s.io/api resource/v1.
	Limits map[string]int
	// PerNode is structured.ErrFailedAllocationOnNode (1.35+): an error that
	// wraps it is about this node only. Nil on 1.34, where every Allocate
	// error fails the whole scheduling attempt.
	PerNode error
}

// Main serves requests from stdin until it closes: one JSON Request per line
// in, one JSON Answer per line out (flushed after each). With the argument
// "gates" it prints this minor's default gates instead, with "limits" the
// validation limits of the linked k8s.io/api (given by the main package: their
// names and meaning differ between minors). Answers name the
// k8s.io/dynamic-resource-allocation release linked in.
func Main(m Minor) {
	defaults := m.Defaults
	version := "unknown"
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, dep := range info.Deps {
			if dep.Path == "k8s.io/dynamic-resource-allocation" {
				version = dep.Version
				if dep.Replace != nil {
					version = dep.Replace.Version
				}
			}
		}
	}
	if len(os.Args) > 1 && os.Args[1] == "gates" {
		names := make([]string, 0, len(defaults))
		for name := range defaults {
			names = append(names, name)
		}
		sort.Strings(names)
		ordered := make([]map[string]any, 0, len(names))
		for _, name := range names {
			ordered = append(ordered, map[string]any{"gate": name, "default": defaults[name]})
		}
		if err := json.NewEncoder(os.Stdout).Encode(map[string]any{"version": version, "gates": ordered}); err != nil {
			os.Exit(1)
		}
		return
	}
	if len(os.Args) > 1 && os.Args[1] == "limits" {
		if err := json.NewEncoder(os.Stdout).Encode(map[string]any{"version": version, "limits": m.Limits}); err != nil {
			os.Exit(1)
		}
		return
	}
	if err := serve(context.Background(), os.Stdin, os.Stdout, m, version); err != nil {
		fmt.Fprintln(os.Stderr, "oracle:", err)
		os.Exit(1)
	}
}

func serve(ctx context.Context, in io.Reader, out io.Writer, m Minor, version string) error {
	reader := bufio.NewReaderSize(in, 1<<20)
	writer := bufio.NewWriter(out)
	enc := json.NewEncoder(writer)
	for {
		line, err := reader.ReadBytes('\n')
		if len(line) > 0 && !isBlank(line) {
			var req Request
			var answer Answer
			if jerr := json.Unmarshal(line, &req); jerr != nil {
				answer = Answer{Status: "error", Error: "oracle: bad request: " + jerr.Error(), Version: version}
			} else {
				answer = Run(ctx, m, version, &req)
			}
			if werr := enc.Encode(answer); werr != nil {
				return werr
			}
			if werr := writer.Flush(); werr != nil {
				return werr
			}
		}
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

func isBlank(b []byte) bool {
	for _, c := range b {
		if c != ' ' && c != '\n' && c != '\r' && c != '\t' {
			return false
		}
	}
	return true
}
