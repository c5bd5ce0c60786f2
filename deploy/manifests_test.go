// Package deploy_test validates the Kubernetes manifests offline: each
// kustomization builds (sigs.k8s.io/kustomize/api, the library behind
// kubectl kustomize), every resource decodes strictly into its Kubernetes
// API type (an unknown or misspelt field fails), and the deployment rules
// of deploy/README.md hold.
package deploy_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

// objects of one kustomization, decoded.
type objects struct {
	deployments  []appsv1.Deployment
	statefulSets []appsv1.StatefulSet
	daemonSets   []appsv1.DaemonSet
	jobs         []batchv1.Job
	services     []corev1.Service
	configMaps   []corev1.ConfigMap
	pdbs         []policyv1.PodDisruptionBudget
	netpols      []networkingv1.NetworkPolicy
}

func build(t *testing.T, dir string) objects {
	t.Helper()
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	rm, err := k.Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		t.Fatalf("kustomize build %s: %v", dir, err)
	}
	var o objects
	for _, r := range rm.Resources() {
		y, err := r.AsYAML()
		if err != nil {
			t.Fatal(err)
		}
		kind := r.GetKind()
		var target any
		switch kind {
		case "Deployment":
			o.deployments = append(o.deployments, appsv1.Deployment{})
			target = &o.deployments[len(o.deployments)-1]
		case "StatefulSet":
			o.statefulSets = append(o.statefulSets, appsv1.StatefulSet{})
			target = &o.statefulSets[len(o.statefulSets)-1]
		case "DaemonSet":
			o.daemonSets = append(o.daemonSets, appsv1.DaemonSet{})
			target = &o.daemonSets[len(o.daemonSets)-1]
		case "Job":
			o.jobs = append(o.jobs, batchv1.Job{})
			target = &o.jobs[len(o.jobs)-1]
		case "Service":
			o.services = append(o.services, corev1.Service{})
			target = &o.services[len(o.services)-1]
		case "ConfigMap":
			o.configMaps = append(o.configMaps, corev1.ConfigMap{})
			target = &o.configMaps[len(o.configMaps)-1]
		case "PodDisruptionBudget":
			o.pdbs = append(o.pdbs, policyv1.PodDisruptionBudget{})
			target = &o.pdbs[len(o.pdbs)-1]
		case "NetworkPolicy":
			o.netpols = append(o.netpols, networkingv1.NetworkPolicy{})
			target = &o.netpols[len(o.netpols)-1]
		default:
			t.Fatalf("%s: kind %q has no check here; add its API type", dir, kind)
		}
		if err := yaml.UnmarshalStrict(y, target); err != nil {
			t.Fatalf("%s: %s %s does not match the Kubernetes API: %v", dir, kind, r.GetName(), err)
		}
	}
	return o
}

func container(t *testing.T, spec corev1.PodSpec, name string) corev1.Container {
	t.Helper()
	for _, c := range append(slices.Clone(spec.Containers), spec.InitContainers...) {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("no container %q", name)
	return corev1.Container{}
}

// hardened checks the container rules every workload here follows.
func hardened(t *testing.T, where string, pod corev1.PodSpec, c corev1.Container, probes bool) {
	t.Helper()
	if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() || c.Resources.Limits.Memory().IsZero() {
		t.Errorf("%s/%s: needs cpu and memory requests and a memory limit", where, c.Name)
	}
	sc := c.SecurityContext
	if sc == nil || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
		sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
		sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL") {
		t.Errorf("%s/%s: needs allowPrivilegeEscalation false, a read-only root filesystem and all capabilities dropped", where, c.Name)
	}
	nonRoot := (sc != nil && sc.RunAsNonRoot != nil && *sc.RunAsNonRoot) ||
		(pod.SecurityContext != nil && pod.SecurityContext.RunAsNonRoot != nil && *pod.SecurityContext.RunAsNonRoot)
	if !nonRoot {
		t.Errorf("%s/%s: must run as non-root", where, c.Name)
	}
	if probes && (c.LivenessProbe == nil || c.ReadinessProbe == nil) {
		t.Errorf("%s/%s: needs liveness and readiness probes", where, c.Name)
	}
}

func selects(t *testing.T, what string, sel map[string]string, podLabels map[string]string) {
	t.Helper()
	if len(sel) == 0 || !labels.SelectorFromSet(sel).Matches(labels.Set(podLabels)) {
		t.Errorf("%s selector %v does not select pods labelled %v", what, sel, podLabels)
	}
}

// flagsOf returns the -flag names of a coordinatord command line.
func flagsOf(args []string) []string {
	var out []string
	for _, a := range args {
		name, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
		out = append(out, name)
	}
	return out
}

var (
	binOnce sync.Once
	binDir  string
	bin     string
	binErr  error
	help    string
)

// daemonBinary builds ./cmd/coordinatord once for the package's tests
// (TestMain removes it).
func daemonBinary(t *testing.T) string {
	t.Helper()
	binOnce.Do(func() {
		binDir, binErr = os.MkdirTemp("", "coordinatord-deploy-test")
		if binErr != nil {
			return
		}
		bin = filepath.Join(binDir, "coordinatord")
		cmd := exec.Command("go", "build", "-o", bin, "./cmd/coordinatord")
		cmd.Dir = ".."
		if out, err := cmd.CombinedOutput(); err != nil {
			binErr = fmt.Errorf("build coordinatord: %w\n%s", err, out)
			return
		}
		var out []byte
		out, binErr = exec.Command(bin, "-help").CombinedOutput()
		help = string(out)
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	return bin
}

// daemonFlags is the daemon's -help output (it lists every flag).
func daemonFlags(t *testing.T) string {
	t.Helper()
	daemonBinary(t)
	return help
}

func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

func checkEtcd(t *testing.T, o objects) {
	t.Helper()
	if len(o.statefulSets) != 1 {
		t.Fatalf("%d StatefulSets, want the etcd one", len(o.statefulSets))
	}
	ss := o.statefulSets[0]
	if ss.Spec.Replicas == nil || *ss.Spec.Replicas != 3 {
		t.Errorf("etcd replicas %v, want 3", ss.Spec.Replicas)
	}
	c := container(t, ss.Spec.Template.Spec, "etcd")
	hardened(t, "etcd", ss.Spec.Template.Spec, c, true)
	cmd := strings.Join(c.Command, " ")
	for _, want := range []string{"--client-cert-auth", "--peer-client-cert-auth", "--listen-client-urls=https://", "--listen-peer-urls=https://", "--trusted-ca-file=", "--peer-trusted-ca-file="} {
		if !strings.Contains(cmd, want) {
			t.Errorf("etcd command lacks %s", want)
		}
	}
	for i := range 3 {
		if !strings.Contains(cmd, fmt.Sprintf("etcd-%d=https://etcd-%d.%s.", i, i, ss.Spec.ServiceName)) {
			t.Errorf("etcd initial cluster lacks member %d under service %s", i, ss.Spec.ServiceName)
		}
	}
	var headless bool
	for _, s := range o.services {
		if s.Name == ss.Spec.ServiceName && s.Spec.ClusterIP == corev1.ClusterIPNone {
			headless = true
			selects(t, "Service "+s.Name, s.Spec.Selector, ss.Spec.Template.Labels)
		}
	}
	if !headless {
		t.Errorf("no headless Service %q for the StatefulSet", ss.Spec.ServiceName)
	}
	var pdb bool
	for _, p := range o.pdbs {
		if p.Name == "etcd" {
			pdb = true
			selects(t, "PDB etcd", p.Spec.Selector.MatchLabels, ss.Spec.Template.Labels)
			if p.Spec.MaxUnavailable == nil || *p.Spec.MaxUnavailable != intstr.FromInt32(1) {
				t.Errorf("etcd PDB maxUnavailable %v, want 1 (keep quorum)", p.Spec.MaxUnavailable)
			}
		}
	}
	if !pdb {
		t.Error("no PodDisruptionBudget for etcd")
	}
}

func netpolFor(t *testing.T, o objects, podLabels map[string]string) {
	t.Helper()
	for _, np := range o.netpols {
		if labels.SelectorFromSet(np.Spec.PodSelector.MatchLabels).Matches(labels.Set(podLabels)) {
			return
		}
	}
	t.Errorf("no NetworkPolicy selects pods labelled %v", podLabels)
}

func TestSharedService(t *testing.T) {
	o := build(t, "kustomize/shared")
	c := checkShared(t, o)
	// The queue core stays the default: no shard core flag here.
	for _, f := range flagsOf(c.Args) {
		if slices.Contains([]string{"core", "role", "advertise", "member-secret-file", "shard-lease-ttl"}, f) {
			t.Errorf("kustomize/shared passes -%s: the shard core's flags belong to ../components/shard-core", f)
		}
	}
}

// checkShared checks the shared service (and its etcd) that o holds and
// returns its coordinatord container.
func checkShared(t *testing.T, o objects) corev1.Container {
	t.Helper()
	checkEtcd(t, o)
	netpolFor(t, o, o.statefulSets[0].Spec.Template.Labels)
	if len(o.deployments) != 1 {
		t.Fatalf("%d Deployments, want coordinatord", len(o.deployments))
	}
	d := o.deployments[0]
	if d.Spec.Replicas == nil || *d.Spec.Replicas != 3 {
		t.Errorf("coordinatord replicas %v, want 3", d.Spec.Replicas)
	}
	pod := d.Spec.Template
	c := container(t, pod.Spec, "coordinatord")
	hardened(t, "coordinatord", pod.Spec, c, true)
	if c.LivenessProbe.GRPC == nil || c.ReadinessProbe.GRPC == nil || c.ReadinessProbe.GRPC.Service == nil ||
		*c.ReadinessProbe.GRPC.Service != "coordinator.v1.LockService" {
		t.Error("coordinatord probes must be gRPC, readiness on service coordinator.v1.LockService")
	}
	args := strings.Join(c.Args, " ")
	for _, want := range []string{"--tls-cert=", "--tls-client-ca=", "--auth-policy=", "--etcd-ca=", "--etcd-cert=", "--etcd-username=", "--etcd-password-file=", "--health-listen=", "--metrics-listen="} {
		if !strings.Contains(args, want) {
			t.Errorf("coordinatord args lack %s", want)
		}
	}
	help := daemonFlags(t)
	for _, f := range flagsOf(c.Args) {
		if !strings.Contains(help, "-"+f+" ") && !strings.Contains(help, "-"+f+"\n") {
			t.Errorf("coordinatord has no flag -%s", f)
		}
	}
	checkShutdown(t, pod.Spec, c)
	checkFilesMounted(t, pod.Spec, c)
	var svc, headless, pdb bool
	for _, s := range o.services {
		switch s.Name {
		case "coordinatord":
			svc = true
			selects(t, "Service coordinatord", s.Spec.Selector, pod.Labels)
		case "coordinatord-headless": // per-request balancing: dns:/// and round_robin
			headless = s.Spec.ClusterIP == corev1.ClusterIPNone && !s.Spec.PublishNotReadyAddresses &&
				len(s.Spec.Ports) == 1 && s.Spec.Ports[0].Port == 7070
			selects(t, "Service coordinatord-headless", s.Spec.Selector, pod.Labels)
		}
	}
	if !headless {
		t.Error("want a headless Service coordinatord-headless of the ready pods' gRPC port, for client-side round robin")
	}
	for _, p := range o.pdbs {
		if p.Name == "coordinatord" {
			pdb = true
			selects(t, "PDB coordinatord", p.Spec.Selector.MatchLabels, pod.Labels)
		}
	}
	if !svc || !pdb {
		t.Errorf("coordinatord Service %v, PodDisruptionBudget %v: want both", svc, pdb)
	}
	netpolFor(t, o, pod.Labels)
	// The policy the ConfigMap carries is mounted where --auth-policy points.
	if len(o.configMaps) != 1 || o.configMaps[0].Data["policy.json"] == "" {
		t.Fatalf("want one ConfigMap with policy.json, got %d", len(o.configMaps))
	}
	// etcd admits the coordinatord pods as clients.
	etcdNP := o.netpols[slices.IndexFunc(o.netpols, func(n networkingv1.NetworkPolicy) bool { return n.Name == "etcd" })]
	admitted := false
	for _, in := range etcdNP.Spec.Ingress {
		for _, from := range in.From {
			if from.PodSelector != nil && labels.SelectorFromSet(from.PodSelector.MatchLabels).Matches(labels.Set(pod.Labels)) {
				admitted = true
			}
		}
	}
	if !admitted {
		t.Error("etcd's NetworkPolicy does not admit the coordinatord pods")
	}
	return c
}

// checkShutdown: a preStop pause lets the endpoint leave the Service
// before SIGTERM, and the grace period covers the pause and the daemon's
// -shutdown-timeout.
func checkShutdown(t *testing.T, pod corev1.PodSpec, c corev1.Container) {
	t.Helper()
	if c.Lifecycle == nil || c.Lifecycle.PreStop == nil || c.Lifecycle.PreStop.Sleep == nil || c.Lifecycle.PreStop.Sleep.Seconds < 1 {
		t.Fatalf("%s: want a preStop sleep (the image has no shell), got %+v", c.Name, c.Lifecycle)
	}
	pause := time.Duration(c.Lifecycle.PreStop.Sleep.Seconds) * time.Second
	var stop time.Duration
	for _, a := range c.Args {
		if v, ok := strings.CutPrefix(a, "--shutdown-timeout="); ok {
			d, err := time.ParseDuration(v)
			if err != nil {
				t.Fatalf("%s: %v", a, err)
			}
			stop = d
		}
	}
	if stop == 0 {
		t.Fatalf("%s: set --shutdown-timeout, so that the grace period can be checked against it", c.Name)
	}
	if pod.TerminationGracePeriodSeconds == nil || time.Duration(*pod.TerminationGracePeriodSeconds)*time.Second < pause+stop+time.Second {
		t.Errorf("terminationGracePeriodSeconds %v: want above the preStop pause %v plus --shutdown-timeout %v",
			pod.TerminationGracePeriodSeconds, pause, stop)
	}
}

func TestDockerfile(t *testing.T) {
	b, err := os.ReadFile("Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	for _, want := range []string{"CGO_ENABLED=0", "distroless/static", "USER 65532:65532", "./cmd/coordinatord"} {
		if !strings.Contains(s, want) {
			t.Errorf("Dockerfile lacks %q", want)
		}
	}
}
