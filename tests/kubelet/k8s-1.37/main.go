// Command kubelet-dra is the node side of vgpuctl's end-to-end tests on the real control plane:
// the kubelet's own DRA code from k8s.io/kubernetes v1.37.2, run for one node, driving the DRA
// driver (vgpuctl serve) over its real unix sockets.
//
//	kubelet-dra --kubeconfig FILE --node-name NODE --root-dir DIR [--feature-gates A=true,...]
//
// What is the kubelet's own code, unchanged:
//   - pkg/kubelet/pluginmanager: the plugin watcher on DIR/plugins_registry, its reconciler and the
//     registration calls (GetInfo, NotifyRegistrationStatus) to the driver's registration socket;
//   - pkg/kubelet/cm/dra: the DRA manager (dra.NewManager, Start, GetWatcherHandler,
//     PrepareResources, UnprepareResources, GetResources, UpdateAllocatedResourcesStatus,
//     PodMightNeedToUnprepareResources), its claim info cache and its checkpoint
//     DIR/dra_manager_state (the kubelet keeps it in its root directory too), its registration
//     handler (DRAPluginManager: wipes the node's ResourceSlices at start-up, as the kubelet does),
//     its gRPC client of the driver and its health stream.
//
// What stands in for the rest of the kubelet (there is no container runtime here):
//   - the pod workers: an informer on the pods bound to NODE (spec.nodeName, as the kubelet's
//     API source watches) and a rate-limited work queue call PrepareResources for a bound pod
//     (the kubelet calls it in SyncPod before it starts containers) and UnprepareResources for a
//     pod being deleted, deleted outright or finished (the kubelet calls it in SyncTerminatingPod
//     once the containers have stopped);
//   - the container runtime: after a successful prepare the containers count as started: the
//     CDI device IDs the runtime would be given (GetResources, per container) are printed, and
//     the pod's status is written Running (the kubelet's status manager writes the phase);
//   - the status manager's final delete: a pod with a deletionTimestamp is deleted with grace
//     period 0 (UID precondition) once the manager holds nothing for it;
//   - after a restart, the pods the checkpoint names that are no longer bound here are unprepared
//     (UnprepareResources with a pod carrying only its UID and namespace: the claims come from the
//     manager's cache, loaded from the checkpoint) once the driver has registered and the pod
//     informer has synced. In the kubelet, the DRA manager's reconcile loop does this; it runs here
//     too, but v1.37.2 runs it every 60 s (not configurable) and its first round, at start, comes
//     before any driver has registered. A pod still bound is prepared again: the manager marks
//     the entries it restores unprepared and calls NodePrepareResources again, as the kubelet does.
//
// It prints one JSON object per line on stdout, for the tests to wait on: {"event": "ready"},
// {"event": "registered"}, {"event": "prepared"}, {"event": "prepare-failed"}, {"event": "unprepared"},
// {"event": "unprepare-failed"}, {"event": "deleted"}, {"event": "checkpoint"}. Logs go to stderr.
// SIGTERM or SIGINT stops it; the checkpoint stays, as a kubelet's does.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"sync"
	"syscall"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apimachinery/pkg/util/wait"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
	pluginwatcherapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"k8s.io/kubernetes/pkg/kubelet/cm/dra"
	"k8s.io/kubernetes/pkg/kubelet/cm/dra/state"
	"k8s.io/kubernetes/pkg/kubelet/config"
	"k8s.io/kubernetes/pkg/kubelet/events"
	"k8s.io/kubernetes/pkg/kubelet/pluginmanager"
	plugincache "k8s.io/kubernetes/pkg/kubelet/pluginmanager/cache"
)

// checkpointName is the DRA manager's state file in the kubelet's root directory
// (draManagerStateFileName in pkg/kubelet/cm/dra/manager.go, unexported).
const checkpointName = "dra_manager_state"

// requestTimeout bounds each write of the node side: one that hangs is retried, not waited on.
const requestTimeout = 30 * time.Second

// out prints the events the tests wait on, one JSON object per line.
type out struct {
	mu  sync.Mutex
	enc *json.Encoder
}

func (o *out) emit(event string, fields map[string]any) {
	o.mu.Lock()
	defer o.mu.Unlock()
	rec := map[string]any{"event": event}
	for k, v := range fields {
		rec[k] = v
	}
	_ = o.enc.Encode(rec)
}

// registrationHandler is the DRA manager's own handler; it reports each registration too.
type registrationHandler struct {
	plugincache.PluginHandler
	once       sync.Once
	registered chan struct{}
	out        *out
}

func (h *registrationHandler) RegisterPlugin(ctx context.Context, name, endpoint string, versions []string, timeout *time.Duration) error {
	err := h.PluginHandler.RegisterPlugin(ctx, name, endpoint, versions, timeout)
	if err == nil {
		h.out.emit("registered", map[string]any{"driver": name, "endpoint": endpoint, "versions": versions})
		h.once.Do(func() { close(h.registered) })
	}
	return err
}

type node struct {
	name    string
	client  kubernetes.Interface
	manager *dra.Manager
	pods    cache.Indexer
	queue   workqueue.TypedRateLimitingInterface[string]
	rec     record.EventRecorder
	out     *out
	logger  klog.Logger

	mu       sync.Mutex
	gone     map[string][]*v1.Pod // namespace/name -> pods deleted from the API server, not yet unprepared
	prepared map[types.UID]bool   // pods reported prepared by this run
}

func main() {
	var kubeconfig, nodeName, rootDir, gates string
	klog.InitFlags(nil)
	flag.StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig of the API server")
	flag.StringVar(&nodeName, "node-name", "", "the node whose pods this kubelet runs")
	flag.StringVar(&rootDir, "root-dir", "", "the kubelet's root directory: plugins_registry/ and dra_manager_state")
	flag.StringVar(&gates, "feature-gates", "", "kubelet feature gates, A=true,B=false")
	flag.Parse()
	if kubeconfig == "" || nodeName == "" || rootDir == "" {
		fmt.Fprintln(os.Stderr, "kubelet-dra: --kubeconfig, --node-name and --root-dir are required")
		os.Exit(2)
	}
	if gates != "" {
		if err := utilfeature.DefaultMutableFeatureGate.Set(gates); err != nil {
			fmt.Fprintf(os.Stderr, "kubelet-dra: --feature-gates: %v\n", err)
			os.Exit(2)
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := run(ctx, kubeconfig, nodeName, rootDir); err != nil {
		fmt.Fprintf(os.Stderr, "kubelet-dra: %v\n", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, kubeconfig, nodeName, rootDir string) error {
	logger := klog.FromContext(ctx)
	o := &out{enc: json.NewEncoder(os.Stdout)}
	registry := filepath.Join(rootDir, "plugins_registry")
	if err := os.MkdirAll(registry, 0o750); err != nil {
		return err
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return fmt.Errorf("kubeconfig %s: %w", kubeconfig, err)
	}
	cfg.UserAgent = "kubelet-dra/" + nodeName
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	broadcaster := record.NewBroadcaster(record.WithContext(ctx))
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: client.CoreV1().Events("")})
	defer broadcaster.Shutdown()
	recorder := broadcaster.NewRecorder(scheme.Scheme, v1.EventSource{Component: "kubelet", Host: nodeName})

	// The pods the checkpoint names, read by the kubelet's own checkpoint code before the manager
	// loads the same file into its claim info cache.
	inCheckpoint, err := checkpointPods(rootDir)
	if err != nil {
		return err
	}
	o.emit("checkpoint", map[string]any{"pods": inCheckpoint})

	manager, err := dra.NewManager(logger, client, rootDir)
	if err != nil {
		return err
	}
	defer manager.Stop()

	factory := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithTweakListOptions(
		func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", nodeName).String()
		}))
	podInformer := factory.Core().V1().Pods().Informer()
	n := &node{name: nodeName, client: client, manager: manager, pods: podInformer.GetIndexer(), rec: recorder,
		out: o, logger: logger, gone: map[string][]*v1.Pod{}, prepared: map[types.UID]bool{},
		queue: workqueue.NewTypedRateLimitingQueue(workqueue.NewTypedItemExponentialFailureRateLimiter[string](
			100*time.Millisecond, 5*time.Second))}
	defer n.queue.ShutDown()
	if _, err := podInformer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    n.enqueue,
		UpdateFunc: func(_, obj any) { n.enqueue(obj) },
		DeleteFunc: n.deleted,
	}); err != nil {
		return err
	}
	sourcesReady := config.NewSourcesReady(func(_ sets.Set[string]) bool { return podInformer.HasSynced() })
	getNode := func(ctx context.Context) (*v1.Node, error) {
		return client.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
	}
	if err := manager.Start(ctx, n.activePods, getNode, sourcesReady); err != nil {
		return err
	}

	handler := &registrationHandler{PluginHandler: manager.GetWatcherHandler(), registered: make(chan struct{}), out: o}
	plugins := pluginmanager.NewPluginManager(registry, recorder)
	plugins.AddHandler(pluginwatcherapi.DRAPlugin, handler)
	go plugins.Run(ctx, sourcesReady, ctx.Done())
	go drainUpdates(ctx, manager, logger)

	factory.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), podInformer.HasSynced) {
		return ctx.Err()
	}
	o.emit("ready", map[string]any{"node": nodeName, "rootDir": rootDir})
	go n.sweep(ctx, handler.registered, inCheckpoint)
	go wait.UntilWithContext(ctx, n.work, time.Second)
	<-ctx.Done()
	logger.Info("stopping: the checkpoint stays")
	return nil
}

// checkpointed is what the DRA manager's checkpoint holds for one pod.
type checkpointed struct {
	Namespace string   `json:"namespace"`
	Claims    []string `json:"claims"` // ResourceClaim UIDs
}

// checkpointPods: pod UID -> what the checkpoint holds for it, read by the kubelet's own
// checkpoint code (pkg/kubelet/cm/dra/state) from the file the manager loads.
func checkpointPods(rootDir string) (map[string]*checkpointed, error) {
	cp, err := state.NewCheckpointer(rootDir, checkpointName)
	if err != nil {
		return nil, fmt.Errorf("DRA checkpoint in %s: %w", rootDir, err)
	}
	got, err := cp.GetOrCreate()
	if err != nil {
		return nil, fmt.Errorf("DRA checkpoint in %s: %w", rootDir, err)
	}
	list, err := got.GetClaimInfoStateList()
	if err != nil {
		return nil, err
	}
	pods := map[string]*checkpointed{}
	for _, c := range list {
		for uid := range c.PodUIDs {
			if pods[uid] == nil {
				pods[uid] = &checkpointed{Namespace: c.Namespace}
			}
			pods[uid].Claims = append(pods[uid].Claims, string(c.ClaimUID))
		}
	}
	for _, p := range pods {
		sort.Strings(p.Claims)
	}
	return pods, nil
}

// drainUpdates reads the manager's resource health updates (the kubelet resyncs the pods they name).
func drainUpdates(ctx context.Context, m *dra.Manager, logger klog.Logger) {
	for {
		select {
		case <-ctx.Done():
			return
		case u := <-m.Updates():
			logger.V(2).Info("DRA resource health update", "pods", u.PodUIDs)
		}
	}
}

func key(pod *v1.Pod) string { return pod.Namespace + "/" + pod.Name }

func (n *node) enqueue(obj any) {
	if pod, ok := obj.(*v1.Pod); ok {
		n.queue.Add(key(pod))
	}
}

func (n *node) deleted(obj any) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	pod, ok := obj.(*v1.Pod)
	if !ok {
		return
	}
	n.mu.Lock()
	n.gone[key(pod)] = append(n.gone[key(pod)], pod)
	n.mu.Unlock()
	n.queue.Add(key(pod))
}

// activePods: the pods bound here that have not finished (the kubelet's GetActivePods).
func (n *node) activePods() []*v1.Pod {
	var active []*v1.Pod
	for _, obj := range n.pods.List() {
		pod := obj.(*v1.Pod)
		if pod.Status.Phase != v1.PodSucceeded && pod.Status.Phase != v1.PodFailed {
			active = append(active, pod)
		}
	}
	return active
}

func (n *node) work(ctx context.Context) {
	for {
		k, shutdown := n.queue.Get()
		if shutdown {
			return
		}
		err := n.sync(ctx, k)
		if err != nil && ctx.Err() == nil {
			n.logger.Info("Pod sync failed, will retry", "pod", k, "err", err)
			n.queue.AddRateLimited(k)
		} else {
			n.queue.Forget(k)
		}
		n.queue.Done(k)
	}
}

func (n *node) sync(ctx context.Context, k string) error {
	n.mu.Lock()
	gone := n.gone[k]
	n.mu.Unlock()
	for _, pod := range gone {
		if err := n.unprepare(ctx, pod, "deleted", nil); err != nil {
			return err
		}
		n.mu.Lock()
		n.gone[k] = n.gone[k][1:]
		if len(n.gone[k]) == 0 {
			delete(n.gone, k)
		}
		n.mu.Unlock()
	}
	obj, exists, err := n.pods.GetByKey(k)
	if err != nil || !exists {
		return err
	}
	pod := obj.(*v1.Pod)
	switch {
	case pod.DeletionTimestamp != nil:
		if err := n.unprepare(ctx, pod, "terminating", nil); err != nil {
			return err
		}
		n.logger.V(2).Info("Deleting the terminated pod", "pod", k, "podUID", pod.UID)
		return n.finalDelete(ctx, pod)
	case pod.Status.Phase == v1.PodSucceeded || pod.Status.Phase == v1.PodFailed:
		return n.unprepare(ctx, pod, "finished", nil)
	default:
		return n.prepare(ctx, pod)
	}
}

func (n *node) prepare(ctx context.Context, pod *v1.Pod) error {
	if err := n.manager.PrepareResources(ctx, pod); err != nil {
		n.rec.Eventf(pod, v1.EventTypeWarning, events.FailedPrepareDynamicResources, "Failed to prepare dynamic resources: %v", err)
		n.out.emit("prepare-failed", map[string]any{"pod": key(pod), "uid": pod.UID, "error": err.Error()})
		return err
	}
	cdi := map[string][]string{}
	for i := range pod.Spec.Containers {
		c := &pod.Spec.Containers[i]
		info, err := n.manager.GetResources(pod, c)
		if err != nil {
			return err
		}
		ids := []string{}
		for _, d := range info.CDIDevices {
			ids = append(ids, d.Name)
		}
		cdi[c.Name] = ids
	}
	if pod.Status.Phase != v1.PodRunning {
		if err := n.setRunning(ctx, pod); err != nil {
			return err
		}
	}
	n.mu.Lock()
	first := !n.prepared[pod.UID]
	n.prepared[pod.UID] = true
	n.mu.Unlock()
	if first { // once per pod and run: after a restart, what the checkpoint gave back
		n.out.emit("prepared", map[string]any{"pod": key(pod), "uid": pod.UID, "cdi": cdi, "claims": n.claimUIDs(pod)})
	}
	return nil
}

func (n *node) claimUIDs(pod *v1.Pod) []string {
	var uids []string
	for i := range pod.Spec.Containers {
		infos, err := n.manager.GetContainerClaimInfos(pod, &pod.Spec.Containers[i])
		if err != nil {
			continue
		}
		for _, info := range infos {
			uids = append(uids, string(info.ClaimUID))
		}
	}
	sort.Strings(uids)
	return uids
}

// setRunning writes what the kubelet's status manager writes once the containers run.
func (n *node) setRunning(ctx context.Context, pod *v1.Pod) error {
	now := metav1.Now()
	updated := pod.DeepCopy()
	st := &updated.Status
	st.Phase = v1.PodRunning
	if st.StartTime == nil {
		st.StartTime = &now
	}
	for _, t := range []v1.PodConditionType{v1.PodReadyToStartContainers, v1.PodInitialized, v1.ContainersReady, v1.PodReady} {
		setCondition(st, t, now)
	}
	started := true
	st.ContainerStatuses = nil
	for _, c := range pod.Spec.Containers {
		st.ContainerStatuses = append(st.ContainerStatuses, v1.ContainerStatus{
			Name: c.Name, Image: c.Image, Ready: true, Started: &started,
			State: v1.ContainerState{Running: &v1.ContainerStateRunning{StartedAt: now}}})
	}
	n.manager.UpdateAllocatedResourcesStatus(n.logger, pod, st)
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	_, err := n.client.CoreV1().Pods(pod.Namespace).UpdateStatus(ctx, updated, metav1.UpdateOptions{})
	return err
}

func setCondition(st *v1.PodStatus, t v1.PodConditionType, now metav1.Time) {
	for i := range st.Conditions {
		if st.Conditions[i].Type == t {
			if st.Conditions[i].Status != v1.ConditionTrue {
				st.Conditions[i].Status, st.Conditions[i].LastTransitionTime = v1.ConditionTrue, now
			}
			return
		}
	}
	st.Conditions = append(st.Conditions, v1.PodCondition{Type: t, Status: v1.ConditionTrue, LastTransitionTime: now})
}

// unprepare: UnprepareResources for a pod; claims (UIDs) are for the report, taken from the
// manager's cache where the pod given carries its spec.
func (n *node) unprepare(ctx context.Context, pod *v1.Pod, why string, claims []string) error {
	if !n.manager.PodMightNeedToUnprepareResources(pod.UID) {
		return nil // nothing prepared for it (or already unprepared)
	}
	if claims == nil {
		claims = n.claimUIDs(pod)
	}
	if err := n.manager.UnprepareResources(ctx, pod); err != nil {
		n.out.emit("unprepare-failed", map[string]any{"pod": key(pod), "uid": pod.UID, "error": err.Error()})
		return err
	}
	n.out.emit("unprepared", map[string]any{"pod": key(pod), "uid": pod.UID, "why": why, "claims": claims})
	return nil
}

// finalDelete: the status manager's delete of a terminated pod (grace period 0, UID precondition).
func (n *node) finalDelete(ctx context.Context, pod *v1.Pod) error {
	zero := int64(0)
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	err := n.client.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{
		GracePeriodSeconds: &zero, Preconditions: &metav1.Preconditions{UID: &pod.UID}})
	n.logger.V(2).Info("Deleted the terminated pod", "pod", key(pod), "podUID", pod.UID, "err", err)
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		return err
	}
	n.out.emit("deleted", map[string]any{"pod": key(pod), "uid": pod.UID})
	return nil
}

// sweep: the pods the checkpoint names that are no longer on the node are unprepared once the
// driver has registered (the claim names come from the manager's cache, read from the checkpoint:
// the pod given here carries only its UID and namespace).
func (n *node) sweep(ctx context.Context, registered <-chan struct{}, inCheckpoint map[string]*checkpointed) {
	select {
	case <-ctx.Done():
		return
	case <-registered:
	}
	present := map[types.UID]bool{}
	for _, obj := range n.pods.List() {
		present[obj.(*v1.Pod).UID] = true
	}
	for uid, held := range inCheckpoint {
		if present[types.UID(uid)] {
			continue
		}
		pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{UID: types.UID(uid), Namespace: held.Namespace}}
		backoff := wait.Backoff{Duration: 100 * time.Millisecond, Factor: 2, Cap: 5 * time.Second, Steps: 1 << 20}
		err := wait.ExponentialBackoffWithContext(ctx, backoff, func(ctx context.Context) (bool, error) {
			return n.unprepare(ctx, pod, "gone while stopped", held.Claims) == nil, nil
		})
		if err != nil && !errors.Is(err, context.Canceled) {
			n.logger.Error(err, "unpreparing a pod from the checkpoint", "podUID", uid)
		}
	}
}
