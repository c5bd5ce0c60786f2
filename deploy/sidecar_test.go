package deploy_test

// The sidecar as a kustomize Component on labelled workloads.

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

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
	checkFilesMounted(t, pod.Spec, c)
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
	componentOnAnyWorkload(t, "sidecar")
}

// componentOnAnyWorkload builds the Component kustomize/components/<name>
// on a throwaway kustomization of a labelled StatefulSet, DaemonSet and Job
// and an unlabelled Deployment, checks the sidecar on the labelled ones and
// none on the other, and returns what it built.
func componentOnAnyWorkload(t *testing.T, name string) objects {
	t.Helper()
	// kustomize refuses a component by absolute path: copy them in (a
	// Component may include another: all of them).
	dir := t.TempDir()
	if err := os.CopyFS(filepath.Join(dir, "components"), os.DirFS("kustomize/components")); err != nil {
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
			"resources: [workloads.yaml]\ncomponents: [components/" + name + "]\n",
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
	return o
}
