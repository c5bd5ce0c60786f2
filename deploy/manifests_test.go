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

// The example kustomization of the sidecar Component: the labelled
// application gets coordinatord, and etcd is not re-applied.
func TestSidecarOverlay(t *testing.T) {
	o := build(t, "kustomize/sidecar")
	if len(o.statefulSets) != 0 {
		t.Errorf("%d StatefulSets: the sidecar example must not bundle etcd", len(o.statefulSets))
	}
	if len(o.deployments) != 1 {
		t.Fatalf("%d Deployments, want the application", len(o.deployments))
	}
	pod := o.deployments[0].Spec.Template
	checkSidecar(t, o, "app", pod)
	hardened(t, "app", pod.Spec, container(t, pod.Spec, "app"), false) // the example application: probes are yours
	env := sidecarEnv(t, o)
	if env["COORDINATORD_KEY_PREFIX"] != "/app/" || env["COORDINATORD_ETCD_USERNAME"] != "app" {
		t.Errorf("the example's settings did not merge into the Component's ConfigMap: %v", env)
	}
}

// checkSidecar checks the coordinatord sidecar the Component adds to pod.
func checkSidecar(t *testing.T, o objects, where string, pod corev1.PodTemplateSpec) {
	t.Helper()
	c := container(t, pod.Spec, "coordinatord")
	hardened(t, where, pod.Spec, c, true)
	if c.RestartPolicy == nil || *c.RestartPolicy != corev1.ContainerRestartPolicyAlways {
		t.Errorf("%s: the sidecar must be a native sidecar (init container, restartPolicy Always)", where)
	}
	if !slices.Contains(c.Args, "--listen=127.0.0.1:7070") {
		t.Errorf("%s: the sidecar must serve gRPC on loopback only; args %v", where, c.Args)
	}
	help := daemonFlags(t)
	for _, f := range flagsOf(c.Args) {
		if !hasFlag(help, f) {
			t.Errorf("coordinatord has no flag -%s", f)
		}
	}
	// The ConfigMap's variables are the daemon's COORDINATORD_<FLAG>.
	cm := sidecarConfigMap(t, o)
	if len(c.EnvFrom) != 1 || c.EnvFrom[0].ConfigMapRef == nil || c.EnvFrom[0].ConfigMapRef.Name != cm.Name {
		t.Errorf("%s: the sidecar must take its settings from ConfigMap %s; envFrom %v", where, cm.Name, c.EnvFrom)
	}
	for k := range cm.Data {
		f := strings.ReplaceAll(strings.ToLower(strings.TrimPrefix(k, "COORDINATORD_")), "_", "-")
		if !strings.HasPrefix(k, "COORDINATORD_") || !hasFlag(help, f) || !strings.Contains(help, "env "+k+")") {
			t.Errorf("ConfigMap %s: %s is no coordinatord variable", cm.Name, k)
		}
	}
	for _, v := range pod.Spec.Volumes {
		if v.Secret == nil || !strings.HasPrefix(v.Name, "coordinatord-") {
			continue
		}
		if !slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return m.Name == v.Name }) {
			t.Errorf("%s: volume %s is not mounted by the sidecar", where, v.Name)
		}
	}
	if pod.Labels["coordinatord.io/etcd-client"] != "true" {
		t.Errorf("%s: the pod is not labelled as an etcd client", where)
	}
	if pod.Labels["coordinatord.io/sidecar"] != "true" {
		t.Errorf("%s: the pod is not labelled coordinatord.io/sidecar (the PodMonitor selects it)", where)
	}
}

func hasFlag(help, f string) bool {
	return strings.Contains(help, "-"+f+" ") || strings.Contains(help, "-"+f+"\n")
}

func sidecarConfigMap(t *testing.T, o objects) corev1.ConfigMap {
	t.Helper()
	for _, cm := range o.configMaps {
		if strings.HasPrefix(cm.Name, "coordinatord-sidecar") {
			return cm
		}
	}
	t.Fatal("no ConfigMap coordinatord-sidecar")
	return corev1.ConfigMap{}
}

func sidecarEnv(t *testing.T, o objects) map[string]string {
	t.Helper()
	return sidecarConfigMap(t, o).Data
}

// The Component works on any labelled workload of a user's kustomization,
// whatever its kind and name, and leaves unlabelled ones alone.
func TestSidecarComponentOnAnyWorkload(t *testing.T) {
	// kustomize refuses a component by absolute path: copy it in.
	dir := t.TempDir()
	if err := os.CopyFS(filepath.Join(dir, "sidecar"), os.DirFS("kustomize/components/sidecar")); err != nil {
		t.Fatal(err)
	}
	pod := func(labelled bool) string {
		l := ""
		if labelled {
			l = "\n  labels: {coordinatord.io/sidecar: \"true\"}"
		}
		return l + `
spec:
  selector: {matchLabels: {app: x}}
  template:
    metadata: {labels: {app: x}}
    spec:
      securityContext: {runAsNonRoot: true}
      containers: [{name: main, image: example}]
`
	}
	files := map[string]string{
		"kustomization.yaml": "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n" +
			"resources: [workloads.yaml]\ncomponents: [sidecar]\n",
		"workloads.yaml": "apiVersion: apps/v1\nkind: StatefulSet\nmetadata:\n  name: db" + pod(true) +
			"---\napiVersion: apps/v1\nkind: DaemonSet\nmetadata:\n  name: agent" + pod(true) +
			"---\napiVersion: batch/v1\nkind: Job\nmetadata:\n  name: nightly" +
			strings.Replace(pod(true), "  selector: {matchLabels: {app: x}}\n", "", 1) +
			"---\napiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: plain" + pod(false),
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	o := build(t, dir)
	if len(o.statefulSets) != 1 || len(o.daemonSets) != 1 || len(o.jobs) != 1 || len(o.deployments) != 1 {
		t.Fatalf("built %d StatefulSets, %d DaemonSets, %d Jobs, %d Deployments; want one of each",
			len(o.statefulSets), len(o.daemonSets), len(o.jobs), len(o.deployments))
	}
	checkSidecar(t, o, "StatefulSet db", o.statefulSets[0].Spec.Template)
	checkSidecar(t, o, "DaemonSet agent", o.daemonSets[0].Spec.Template)
	checkSidecar(t, o, "Job nightly", o.jobs[0].Spec.Template)
	for _, p := range []corev1.PodTemplateSpec{o.statefulSets[0].Spec.Template, o.daemonSets[0].Spec.Template, o.jobs[0].Spec.Template} {
		if len(p.Spec.Containers) != 1 || p.Spec.Containers[0].Name != "main" {
			t.Errorf("the workload's own containers changed: %v", p.Spec.Containers)
		}
	}
	plain := o.deployments[0].Spec.Template.Spec
	if len(plain.InitContainers) != 0 || len(plain.Volumes) != 0 {
		t.Errorf("the unlabelled Deployment got the sidecar: %v", plain.InitContainers)
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
