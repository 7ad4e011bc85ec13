// Command controlplane starts a real Kubernetes control plane for vgpuctl's tests in ONE process,
// on loopback: an embedded etcd, kube-apiserver, kube-scheduler and kube-controller-manager, all
// from the upstream modules (k8s.io/kubernetes, go.etcd.io/etcd/server/v3). Nodes are Node objects
// created by the tests; there is no kubelet.
//
//	controlplane --kubeconfig-out FILE [--feature-gates DRADeviceTaints=true,...] [--data-dir DIR]
//
// It writes FILE (atomically, by rename) once the API server answers and the scheduler and the
// controller manager have started, prints "ready <server-url>" on stdout, and stays in the
// foreground until SIGTERM or SIGINT.
package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/pflag"
	"go.etcd.io/etcd/server/v3/embed"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/version"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apiserver/pkg/util/compatibility"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	clientgofeatures "k8s.io/client-go/features"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/component-base/featuregate"
	"k8s.io/klog/v2"

	apiserverapp "k8s.io/kubernetes/cmd/kube-apiserver/app"
	apiserveroptions "k8s.io/kubernetes/cmd/kube-apiserver/app/options"
	cmapp "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	cmoptions "k8s.io/kubernetes/cmd/kube-controller-manager/app/options"
	schedapp "k8s.io/kubernetes/cmd/kube-scheduler/app"
	schedoptions "k8s.io/kubernetes/cmd/kube-scheduler/app/options"
)

const defaultControllers = "resourceclaim-controller,device-taint-eviction-controller," +
	"serviceaccount-controller,garbage-collector-controller,namespace-controller"

type settings struct {
	kubeconfigOut string
	dataDir       string
	controllers   string
	authzMode     string
	noScheduler   bool
	noControllers bool
	apiserverArgs []string
	schedArgs     []string
	cmArgs        []string
}

func main() {
	var s settings
	fs := pflag.NewFlagSet("controlplane", pflag.ContinueOnError)
	fs.StringVar(&s.kubeconfigOut, "kubeconfig-out", "", "write an admin kubeconfig here once the control plane answers (required)")
	fs.StringVar(&s.dataDir, "data-dir", "", "etcd data, certificates and keys (default: a temporary directory, removed on exit)")
	fs.StringVar(&s.controllers, "controllers", defaultControllers, "kube-controller-manager --controllers")
	fs.StringVar(&s.authzMode, "authorization-mode", "RBAC", "kube-apiserver --authorization-mode")
	fs.BoolVar(&s.noScheduler, "no-scheduler", false, "start no kube-scheduler")
	fs.BoolVar(&s.noControllers, "no-controller-manager", false, "start no kube-controller-manager")
	fs.StringArrayVar(&s.apiserverArgs, "apiserver-arg", nil, "one more kube-apiserver flag, e.g. --apiserver-arg=--runtime-config=resource.k8s.io/v1beta2=true")
	fs.StringArrayVar(&s.schedArgs, "scheduler-arg", nil, "one more kube-scheduler flag")
	fs.StringArrayVar(&s.cmArgs, "controller-manager-arg", nil, "one more kube-controller-manager flag")
	// kube-controller-manager 1.34 turns client-go's WatchListClient gate (beta, off) on for itself
	// when it adds its flags, which panics once the gates are in a flag set: the three components
	// share one gate here, so it is on for all of them, from the start
	if err := utilfeature.DefaultMutableFeatureGate.OverrideDefaultAtVersion(
		featuregate.Feature(clientgofeatures.WatchListClient), true, version.MustParse("1.34")); err != nil {
		fmt.Fprintln(os.Stderr, "controlplane: WatchListClient:", err)
		os.Exit(1)
	}
	// --feature-gates and --emulated-version: one registry, shared by the three components
	compatibility.DefaultComponentGlobalsRegistry.AddFlags(fs)
	gofs := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(gofs)
	fs.AddGoFlagSet(gofs)
	if err := fs.Parse(os.Args[1:]); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintln(os.Stderr, "controlplane:", err)
		os.Exit(2)
	}
	if s.kubeconfigOut == "" {
		fmt.Fprintln(os.Stderr, "controlplane: --kubeconfig-out is required")
		os.Exit(2)
	}
	if err := compatibility.DefaultComponentGlobalsRegistry.Set(); err != nil {
		fmt.Fprintln(os.Stderr, "controlplane: --feature-gates:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := run(ctx, s); err != nil {
		fmt.Fprintln(os.Stderr, "controlplane:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, s settings) error {
	if s.dataDir == "" {
		dir, err := os.MkdirTemp("", "controlplane-")
		if err != nil {
			return err
		}
		defer func() { _ = os.RemoveAll(dir) }()
		s.dataDir = dir
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make(chan error, 4)

	etcdURL, closeEtcd, err := startEtcd(filepath.Join(s.dataDir, "etcd"))
	if err != nil {
		return fmt.Errorf("etcd: %w", err)
	}
	defer closeEtcd()

	port, err := freePort()
	if err != nil {
		return err
	}
	token, err := writeSecrets(s.dataDir)
	if err != nil {
		return err
	}
	if err := startAPIServer(ctx, s, etcdURL, port, errs); err != nil {
		return fmt.Errorf("kube-apiserver: %w", err)
	}
	server := "https://127.0.0.1:" + strconv.Itoa(port)
	ca, err := os.ReadFile(filepath.Join(s.dataDir, "apiserver-certs", "apiserver.crt"))
	if err != nil {
		return fmt.Errorf("kube-apiserver serving certificate: %w", err)
	}
	kubeconfig := clientcmdapi.NewConfig()
	kubeconfig.Clusters["controlplane"] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: ca}
	kubeconfig.AuthInfos["admin"] = &clientcmdapi.AuthInfo{Token: token}
	kubeconfig.Contexts["controlplane"] = &clientcmdapi.Context{Cluster: "controlplane", AuthInfo: "admin", Namespace: "default"}
	kubeconfig.CurrentContext = "controlplane"
	internal := filepath.Join(s.dataDir, "admin.kubeconfig")
	if err := clientcmd.WriteToFile(*kubeconfig, internal); err != nil {
		return err
	}
	if err := waitForAPIServer(ctx, internal, errs); err != nil {
		return fmt.Errorf("kube-apiserver did not answer: %w", err)
	}
	if !s.noScheduler {
		if err := startScheduler(ctx, s, internal, errs); err != nil {
			return fmt.Errorf("kube-scheduler: %w", err)
		}
	}
	if !s.noControllers {
		if err := startControllerManager(ctx, s, internal, errs); err != nil {
			return fmt.Errorf("kube-controller-manager: %w", err)
		}
		if strings.Contains(s.controllers, "serviceaccount-controller") {
			// pods are refused until their namespace's "default" ServiceAccount exists
			if err := waitForDefaultServiceAccount(ctx, internal, errs); err != nil {
				return fmt.Errorf("no default ServiceAccount: %w", err)
			}
		}
	}
	tmp := s.kubeconfigOut + ".tmp"
	if err := clientcmd.WriteToFile(*kubeconfig, tmp); err != nil {
		return err
	}
	if err := os.Rename(tmp, s.kubeconfigOut); err != nil {
		return err
	}
	fmt.Printf("ready %s\n", server)
	select {
	case <-ctx.Done():
		cancel()
		// give the components a moment to stop their informers before etcd goes away
		time.Sleep(200 * time.Millisecond)
		return nil
	case err := <-errs:
		return err
	}
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer func() { _ = l.Close() }()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func startEtcd(dir string) (string, func(), error) {
	cfg := embed.NewConfig()
	cfg.Name = "controlplane"
	cfg.Dir = dir
	cfg.LogLevel = "error"
	cfg.UnsafeNoFsync = true
	var urls [2]url.URL
	for i := range urls {
		p, err := freePort()
		if err != nil {
			return "", nil, err
		}
		u, _ := url.Parse("http://127.0.0.1:" + strconv.Itoa(p))
		urls[i] = *u
	}
	cfg.ListenClientUrls = []url.URL{urls[0]}
	cfg.AdvertiseClientUrls = []url.URL{urls[0]}
	cfg.ListenPeerUrls = []url.URL{urls[1]}
	cfg.AdvertisePeerUrls = []url.URL{urls[1]}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return "", nil, err
	}
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		e.Close()
		return "", nil, err
	case <-time.After(60 * time.Second):
		e.Close()
		return "", nil, errors.New("not ready after 60s")
	}
	return urls[0].String(), e.Close, nil
}

// writeSecrets writes the service-account signing key and the static token file; returns the
// admin token (user "admin" in system:masters).
func writeSecrets(dir string) (string, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", err
	}
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(dir, "sa.key"), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), 0o600); err != nil {
		return "", err
	}
	raw := make([]byte, 16)
	if _, err := rand.Read(raw); err != nil {
		return "", err
	}
	token := hex.EncodeToString(raw)
	line := token + ",admin,admin,system:masters\n"
	return token, os.WriteFile(filepath.Join(dir, "tokens.csv"), []byte(line), 0o600)
}

func parseInto(nfs map[string]*pflag.FlagSet, name string, args []string) error {
	fs := pflag.NewFlagSet(name, pflag.ContinueOnError)
	for _, f := range nfs {
		fs.AddFlagSet(f)
	}
	return fs.Parse(args)
}

func startAPIServer(ctx context.Context, s settings, etcdURL string, port int, errs chan<- error) error {
	o := apiserveroptions.NewServerRunOptions()
	named := o.Flags()
	args := []string{
		"--etcd-servers=" + etcdURL,
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(port),
		"--cert-dir=" + filepath.Join(s.dataDir, "apiserver-certs"),
		"--service-cluster-ip-range=10.0.0.0/16",
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-account-key-file=" + filepath.Join(s.dataDir, "sa.key"),
		"--service-account-signing-key-file=" + filepath.Join(s.dataDir, "sa.key"),
		"--token-auth-file=" + filepath.Join(s.dataDir, "tokens.csv"),
		"--authorization-mode=" + s.authzMode,
		"--endpoint-reconciler-type=none",
		"--profiling=false",
	}
	if err := parseInto(named.FlagSets, "kube-apiserver", append(args, s.apiserverArgs...)); err != nil {
		return err
	}
	completed, err := o.Complete(ctx)
	if err != nil {
		return err
	}
	if v := completed.Validate(); len(v) != 0 {
		return errors.Join(v...)
	}
	go func() {
		if err := apiserverapp.Run(ctx, completed); err != nil && ctx.Err() == nil {
			errs <- fmt.Errorf("kube-apiserver: %w", err)
		}
	}()
	return nil
}

// waitFor polls the API server kubeconfig names until ready says so (2 minutes at most); an error
// a component sends on errs ends the wait at once.
func waitFor(ctx context.Context, kubeconfig string, errs <-chan error,
	ready func(context.Context, kubernetes.Interface) bool) error {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return err
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	return wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		select {
		case err := <-errs:
			return false, err
		default:
		}
		return ready(ctx, client), nil
	})
}

func waitForAPIServer(ctx context.Context, kubeconfig string, errs <-chan error) error {
	return waitFor(ctx, kubeconfig, errs, func(ctx context.Context, client kubernetes.Interface) bool {
		status := 0
		client.CoreV1().RESTClient().Get().AbsPath("/readyz").Do(ctx).StatusCode(&status)
		if status != 200 {
			return false
		}
		_, err := client.CoreV1().Namespaces().Get(ctx, "default", metav1.GetOptions{})
		return err == nil
	})
}

func waitForDefaultServiceAccount(ctx context.Context, kubeconfig string, errs <-chan error) error {
	return waitFor(ctx, kubeconfig, errs, func(ctx context.Context, client kubernetes.Interface) bool {
		_, err := client.CoreV1().ServiceAccounts("default").Get(ctx, "default", metav1.GetOptions{})
		return err == nil
	})
}

func startScheduler(ctx context.Context, s settings, kubeconfig string, errs chan<- error) error {
	o := schedoptions.NewOptions()
	args := []string{"--kubeconfig=" + kubeconfig, "--leader-elect=false", "--secure-port=0"}
	if err := parseInto(o.Flags.FlagSets, "kube-scheduler", append(args, s.schedArgs...)); err != nil {
		return err
	}
	cc, sched, err := schedapp.Setup(ctx, o)
	if err != nil {
		return err
	}
	go func() {
		if err := schedapp.Run(ctx, cc, sched); err != nil && ctx.Err() == nil {
			errs <- fmt.Errorf("kube-scheduler: %w", err)
		}
	}()
	return nil
}

func startControllerManager(ctx context.Context, s settings, kubeconfig string, errs chan<- error) error {
	o, err := cmoptions.NewKubeControllerManagerOptions()
	if err != nil {
		return err
	}
	known, off, aliases := cmapp.KnownControllers(), cmapp.ControllersDisabledByDefault(), cmapp.ControllerAliases()
	named := o.Flags(known, off, aliases)
	args := []string{
		"--kubeconfig=" + kubeconfig,
		"--leader-elect=false",
		"--secure-port=0",
		"--controllers=" + strings.TrimSpace(s.controllers),
		"--use-service-account-credentials=false",
	}
	if err := parseInto(named.FlagSets, "kube-controller-manager", append(args, s.cmArgs...)); err != nil {
		return err
	}
	c, err := o.Config(ctx, known, off, aliases)
	if err != nil {
		return err
	}
	go func() {
		if err := cmapp.Run(ctx, c.Complete()); err != nil && ctx.Err() == nil {
			errs <- fmt.Errorf("kube-controller-manager: %w", err)
		}
	}()
	return nil
}
