package deploy_test

// The shard-owner core's variants: the shared service with the Component
// components/shard-core (kustomize/shared-shard), and the relay sidecar
// (components/sidecar-relay, example kustomize/sidecar-relay). The queue
// core stays the default of kustomize/shared and kustomize/sidecar.

import (
	iofs "io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/api/types"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

// argValue is the value of --name=value (or -name=value) in args.
func argValue(args []string, name string) (string, bool) {
	for _, a := range args {
		n, v, ok := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if ok && n == name {
			return v, true
		}
	}
	return "", false
}

// mountedFrom returns the volume that c mounts at the directory of file.
func mountedFrom(t *testing.T, pod corev1.PodSpec, c corev1.Container, file string) corev1.Volume {
	t.Helper()
	dir := path.Dir(file)
	for _, m := range c.VolumeMounts {
		if m.MountPath != dir || m.SubPath != "" {
			continue
		}
		if !m.ReadOnly {
			t.Errorf("%s: %s is mounted writable", c.Name, m.MountPath)
		}
		for _, v := range pod.Volumes {
			if v.Name == m.Name {
				return v
			}
		}
		t.Fatalf("%s: mount %s names no volume %q", c.Name, dir, m.Name)
	}
	t.Fatalf("%s: nothing is mounted at %s (for %s)", c.Name, dir, file)
	return corev1.Volume{}
}

// fileFlags are the daemon's flags that name a file.
var fileFlags = []string{"tls-cert", "tls-key", "tls-client-ca", "auth-policy", "auth-tokens", "etcd-ca", "etcd-cert", "etcd-key", "etcd-password-file", "member-secret-file"}

// checkFilesMounted: every file c's args name is in a volume c mounts.
func checkFilesMounted(t *testing.T, pod corev1.PodSpec, c corev1.Container) {
	t.Helper()
	for _, f := range fileFlags {
		if v, ok := argValue(c.Args, f); ok {
			mountedFrom(t, pod, c, v)
		}
	}
}

// checkMemberSecret: --member-secret-file is the key "secret" of the
// Secret coordinatord-member-secret, which the operator creates (it is
// not optional: a pod without it does not start).
func checkMemberSecret(t *testing.T, where string, pod corev1.PodSpec, c corev1.Container) {
	t.Helper()
	file, ok := argValue(c.Args, "member-secret-file")
	if !ok {
		t.Errorf("%s: no --member-secret-file", where)
		return
	}
	v := mountedFrom(t, pod, c, file)
	if v.Secret == nil || v.Secret.SecretName != "coordinatord-member-secret" || len(v.Secret.Items) != 0 ||
		(v.Secret.Optional != nil && *v.Secret.Optional) {
		t.Errorf("%s: --member-secret-file=%s is in volume %+v; want the Secret coordinatord-member-secret (required, every key)", where, file, v.VolumeSource)
	}
	if path.Base(file) != "secret" {
		t.Errorf("%s: --member-secret-file=%s; want the Secret's key \"secret\" (deploy/README.md creates it so)", where, file)
	}
}

// allows reports whether one NetworkPolicy rule (its peers and ports)
// admits pods labelled l (in the policy's namespace) on TCP port.
func allows(peers []networkingv1.NetworkPolicyPeer, ports []networkingv1.NetworkPolicyPort, l map[string]string, port int32) bool {
	portOK := len(ports) == 0
	for _, p := range ports {
		tcp := p.Protocol == nil || *p.Protocol == corev1.ProtocolTCP
		if tcp && (p.Port == nil || (p.Port.Type == intstr.Int && p.Port.IntVal == port)) {
			portOK = true
		}
	}
	peerOK := len(peers) == 0
	for _, p := range peers {
		if p.PodSelector != nil && p.NamespaceSelector == nil && p.IPBlock == nil &&
			labels.SelectorFromSet(p.PodSelector.MatchLabels).Matches(labels.Set(l)) {
			peerOK = true
		}
	}
	return portOK && peerOK
}

// reachable reports whether the NetworkPolicies of o let pods labelled
// from open connections to pods labelled to on port: egress from the
// first and ingress to the second (a direction no policy restricts is
// open).
func reachable(o objects, from, to map[string]string, port int32) bool {
	direction := func(pod map[string]string, typ networkingv1.PolicyType, rule func(networkingv1.NetworkPolicy) bool) bool {
		restricted := false
		for _, np := range o.netpols {
			if !labels.SelectorFromSet(np.Spec.PodSelector.MatchLabels).Matches(labels.Set(pod)) || !slices.Contains(np.Spec.PolicyTypes, typ) {
				continue
			}
			restricted = true
			if rule(np) {
				return true
			}
		}
		return !restricted
	}
	out := direction(from, networkingv1.PolicyTypeEgress, func(np networkingv1.NetworkPolicy) bool {
		return slices.ContainsFunc(np.Spec.Egress, func(r networkingv1.NetworkPolicyEgressRule) bool { return allows(r.To, r.Ports, to, port) })
	})
	in := direction(to, networkingv1.PolicyTypeIngress, func(np networkingv1.NetworkPolicy) bool {
		return slices.ContainsFunc(np.Spec.Ingress, func(r networkingv1.NetworkPolicyIngressRule) bool { return allows(r.From, r.Ports, from, port) })
	})
	return out && in
}

// The shared service on the shard core: everything kustomize/shared
// checks, plus the shard core's flags, the pod IP it advertises, the
// member secret it mounts, its own etcd prefix, and replicas that reach
// each other's gRPC port.
func TestSharedShardCore(t *testing.T) {
	queue := build(t, "kustomize/shared")
	qc := container(t, queue.deployments[0].Spec.Template.Spec, "coordinatord")
	o := build(t, "kustomize/shared-shard")
	c := checkShared(t, o)
	pod := o.deployments[0].Spec.Template

	if v, _ := argValue(c.Args, "core"); v != "shard" {
		t.Errorf("--core=%q, want shard", v)
	}
	if v, ok := argValue(c.Args, "role"); ok && v != "member" {
		t.Errorf("--role=%q: the shared replicas are members", v)
	}
	// --advertise=$(POD_IP):<the gRPC port>, POD_IP from the downward API.
	var grpcPort int32
	for _, p := range c.Ports {
		if p.Name == "grpc" {
			grpcPort = p.ContainerPort
		}
	}
	listen, _ := argValue(c.Args, "listen")
	if grpcPort == 0 || !strings.HasSuffix(listen, ":"+itoa(grpcPort)) {
		t.Fatalf("gRPC port %d, --listen=%s: want the container port named grpc to be the one listened on", grpcPort, listen)
	}
	if v, _ := argValue(c.Args, "advertise"); v != "$(POD_IP):"+itoa(grpcPort) {
		t.Errorf("--advertise=%q, want $(POD_IP):%d", v, grpcPort)
	}
	i := slices.IndexFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == "POD_IP" })
	if i < 0 || c.Env[i].ValueFrom == nil || c.Env[i].ValueFrom.FieldRef == nil || c.Env[i].ValueFrom.FieldRef.FieldPath != "status.podIP" {
		t.Errorf("the container needs env POD_IP from fieldRef status.podIP (for $(POD_IP) in --advertise); env %v", c.Env)
	}
	checkMemberSecret(t, "shared-shard", pod.Spec, c)
	checkFilesMounted(t, pod.Spec, c)
	ttl, _ := argValue(c.Args, "shard-lease-ttl")
	if d, err := time.ParseDuration(ttl); err != nil || d < time.Second || d%time.Second != 0 {
		t.Errorf("--shard-lease-ttl=%q: want whole seconds, at least 1s (%v)", ttl, err)
	}
	// The two cores never share an etcd prefix (neither sees the other's
	// locks): the shard core's is its own, and neither contains the other.
	sp, _ := argValue(c.Args, "key-prefix")
	qp, _ := argValue(qc.Args, "key-prefix")
	if sp == "" || qp == "" || strings.HasPrefix(sp, qp) || strings.HasPrefix(qp, sp) {
		t.Errorf("--key-prefix %q (shard) and %q (queue): want two prefixes, neither inside the other", sp, qp)
	}
	// Everything else of the queue variant is kept.
	for _, a := range qc.Args {
		if !strings.HasPrefix(a, "--key-prefix=") && !slices.Contains(c.Args, a) {
			t.Errorf("the shard variant lost %s", a)
		}
	}
	// Members forward calls to each other's gRPC port.
	if !reachable(o, pod.Labels, pod.Labels, grpcPort) {
		t.Errorf("the NetworkPolicies do not let the replicas (pods labelled %v) reach each other on port %d", pod.Labels, grpcPort)
	}
}

func itoa(n int32) string { return strconv.Itoa(int(n)) }

// checkRelay checks the relay sidecar of components/sidecar-relay in pod
// (checkSidecar checks what it shares with the member sidecar).
func checkRelay(t *testing.T, o objects, where string, pod corev1.PodTemplateSpec) {
	t.Helper()
	checkSidecar(t, o, where, pod)
	c := container(t, pod.Spec, "coordinatord")
	if v, _ := argValue(c.Args, "core"); v != "shard" {
		t.Errorf("%s: --core=%q, want shard", where, v)
	}
	if v, _ := argValue(c.Args, "role"); v != "relay" {
		t.Errorf("%s: --role=%q, want relay", where, v)
	}
	// The members require mutual TLS and a replica dials its peers with its
	// own TLS files: the relay has them, from its own Secret.
	for _, f := range []string{"tls-cert", "tls-key", "tls-client-ca"} {
		v, ok := argValue(c.Args, f)
		if !ok {
			t.Errorf("%s: no --%s: the relay could not dial the members (mutual TLS)", where, f)
			continue
		}
		if vol := mountedFrom(t, pod.Spec, c, v); vol.Secret == nil || vol.Secret.SecretName != "coordinatord-relay-tls" {
			t.Errorf("%s: --%s=%s is not in the Secret coordinatord-relay-tls: %+v", where, f, v, vol.VolumeSource)
		}
	}
	// It authorizes its callers with the cell's policy and forwards their
	// identities with the member secret (the daemon refuses a relay with
	// -auth-policy and no -member-secret-file).
	if v, ok := argValue(c.Args, "auth-policy"); !ok {
		t.Errorf("%s: no --auth-policy", where)
	} else if vol := mountedFrom(t, pod.Spec, c, v); vol.ConfigMap == nil {
		t.Errorf("%s: --auth-policy=%s is not in a ConfigMap: %+v", where, v, vol.VolumeSource)
	}
	checkMemberSecret(t, where, pod.Spec, c)
	checkFilesMounted(t, pod.Spec, c)
	// The cell's etcd prefix: the relay reads the owners under it.
	cell := build(t, "kustomize/shared-shard")
	want, _ := argValue(container(t, cell.deployments[0].Spec.Template.Spec, "coordinatord").Args, "key-prefix")
	if got := sidecarEnv(t, o)["COORDINATORD_KEY_PREFIX"]; got != want {
		t.Errorf("%s: the relay's COORDINATORD_KEY_PREFIX %q is not the cell's --key-prefix %q", where, got, want)
	}
	if _, ok := argValue(c.Args, "key-prefix"); ok {
		t.Errorf("%s: --key-prefix in the args would hide the ConfigMap's", where)
	}
}

// The example of the relay Component: the application gets the relay, in
// front of the shared cell of kustomize/shared-shard.
func TestSidecarRelayOverlay(t *testing.T) {
	o := build(t, "kustomize/sidecar-relay")
	if len(o.statefulSets) != 0 {
		t.Errorf("%d StatefulSets: the relay example must not bundle etcd", len(o.statefulSets))
	}
	if len(o.deployments) != 1 {
		t.Fatalf("%d Deployments, want the application", len(o.deployments))
	}
	pod := o.deployments[0].Spec.Template
	checkRelay(t, o, "app", pod)
	hardened(t, "app", pod.Spec, container(t, pod.Spec, "app"), false)
	if u := sidecarEnv(t, o)["COORDINATORD_ETCD_USERNAME"]; u != "app-relay" {
		t.Errorf("the example's etcd user did not merge into the Component's ConfigMap: %q", u)
	}
	// The sidecars' PodMonitor scrapes the relays too.
	m := buildMonitoring(t)
	i := slices.IndexFunc(m.podMonitors, func(pm monitor) bool { return pm.Metadata.Name == "coordinatord-sidecar" })
	if i < 0 || !matches(t, m.podMonitors[i].Spec.Selector, pod.Labels) {
		t.Fatalf("the PodMonitor coordinatord-sidecar does not select the relay's pods (labels %v)", pod.Labels)
	}
	checkEndpoints(t, "PodMonitor coordinatord-sidecar on the relay", m.podMonitors[i].Spec.PodMetricsEndpoints,
		portNames(append(slices.Clone(pod.Spec.Containers), pod.Spec.InitContainers...)))
}

// The relay Component on any labelled workload, as the member sidecar.
func TestSidecarRelayComponentOnAnyWorkload(t *testing.T) {
	o := componentOnAnyWorkload(t, "sidecar-relay")
	checkRelay(t, o, "StatefulSet db", o.statefulSets[0].Spec.Template)
	checkRelay(t, o, "DaemonSet agent", o.daemonSets[0].Spec.Template)
	checkRelay(t, o, "Job nightly", o.jobs[0].Spec.Template)
}

// The member sidecar stays as it was: the default (queue) core, no shard
// core flag.
func TestSidecarDefaultsToTheQueueCore(t *testing.T) {
	o := build(t, "kustomize/sidecar")
	c := container(t, o.deployments[0].Spec.Template.Spec, "coordinatord")
	for _, f := range flagsOf(c.Args) {
		if slices.Contains([]string{"core", "role", "advertise", "member-secret-file", "shard-lease-ttl"}, f) {
			t.Errorf("kustomize/sidecar passes -%s: the shard core's flags belong to components/sidecar-relay", f)
		}
	}
	for k := range sidecarEnv(t, o) {
		if k == "COORDINATORD_CORE" || k == "COORDINATORD_ROLE" {
			t.Errorf("the member sidecar's ConfigMap sets %s", k)
		}
	}
}

// No Secret of deploy/ carries a value: every Secret the manifests use is
// created by the operator (deploy/README.md). No manifest is a Secret with
// data, no kustomization generates one, and no kustomization builds one.
func TestNoSecretValuesInTheRepository(t *testing.T) {
	var kustomizations []string
	err := filepath.WalkDir(".", func(p string, d iofs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if p != "." && strings.HasPrefix(d.Name(), ".") {
				return filepath.SkipDir
			}
			return nil
		}
		ext := filepath.Ext(p)
		if ext != ".yaml" && ext != ".yml" {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		for i, doc := range strings.Split(string(b), "\n---") {
			var m struct {
				Kind            string             `json:"kind"`
				Data            map[string]any     `json:"data"`
				StringData      map[string]any     `json:"stringData"`
				SecretGenerator []types.SecretArgs `json:"secretGenerator"`
			}
			if err := yaml.Unmarshal([]byte(doc), &m); err != nil {
				t.Errorf("%s, document %d: %v", p, i+1, err)
				continue
			}
			if m.Kind == "Secret" && (len(m.Data) > 0 || len(m.StringData) > 0) {
				t.Errorf("%s, document %d: a Secret with a value", p, i+1)
			}
			if len(m.SecretGenerator) > 0 {
				t.Errorf("%s: a secretGenerator (%v): Secrets are the operator's, not the repository's", p, m.SecretGenerator)
			}
			if filepath.Base(p) == "kustomization.yaml" && i == 0 && m.Kind != "Component" {
				kustomizations = append(kustomizations, filepath.Dir(p))
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"kustomize/shared", "kustomize/shared-shard", "kustomize/sidecar", "kustomize/sidecar-relay", "monitoring"} {
		if !slices.Contains(kustomizations, filepath.FromSlash(want)) {
			t.Errorf("kustomization %s not found among %v", want, kustomizations)
		}
	}
	for _, dir := range kustomizations {
		rm, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), dir)
		if err != nil {
			t.Fatalf("kustomize build %s: %v", dir, err)
		}
		for _, r := range rm.Resources() {
			if r.GetKind() == "Secret" {
				t.Errorf("kustomize build %s makes the Secret %s", dir, r.GetName())
			}
		}
	}
}

// kustomize/shared-shard has no images: entry of its own: it runs the image
// set in kustomize/shared (kustomize edit set image there), or the one an
// overlay of it sets by the placeholder's name.
func TestShardCoreImageIsSetByKustomize(t *testing.T) {
	const (
		placeholder = "registry.invalid/coordinatord:unset"
		newName     = "registry.example.test/team/coordinatord"
		digest      = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	)
	fs := inMemory(t)
	check := func(what, dir, want string) {
		t.Helper()
		n := 0
		for k, img := range podImages(t, fs, dir) {
			if strings.HasSuffix(k, "/coordinatord") {
				n++
				if img != want {
					t.Errorf("%s: %s runs %q, want %q", what, k, img, want)
				}
			}
		}
		if n == 0 {
			t.Fatalf("%s: no coordinatord container", what)
		}
	}
	check("unset", "/kustomize/shared-shard", placeholder)
	overlay := "resources:\n  - ../kustomize/shared-shard\nimages:\n  - name: registry.invalid/coordinatord\n    newName: " + newName + "\n    digest: " + digest + "\n"
	if err := fs.WriteFile("/overlay/kustomization.yaml", []byte(overlay)); err != nil {
		t.Fatal(err)
	}
	check("an overlay", "/overlay", newName+"@"+digest)
	setImage(t, fs, "/kustomize/shared", newName, digest)
	check("set in kustomize/shared", "/kustomize/shared-shard", newName+"@"+digest)
}
