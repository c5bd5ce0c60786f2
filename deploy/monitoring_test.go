package deploy_test

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

// The Prometheus Operator's kinds, as far as deploy/monitoring uses them:
// the kyaml schema (schema_test.go) does not know these CRDs, so they are
// checked here by strict decoding into these types (a misspelt field fails)
// and by the rules below.

type monitorEndpoint struct {
	Port     string `json:"port"`
	Path     string `json:"path"`
	Interval string `json:"interval"`
}

type monitor struct {
	APIVersion string            `json:"apiVersion"`
	Kind       string            `json:"kind"`
	Metadata   metav1.ObjectMeta `json:"metadata"`
	Spec       struct {
		Selector            metav1.LabelSelector `json:"selector"`
		Endpoints           []monitorEndpoint    `json:"endpoints,omitempty"`           // ServiceMonitor
		PodMetricsEndpoints []monitorEndpoint    `json:"podMetricsEndpoints,omitempty"` // PodMonitor
	} `json:"spec"`
}

type alertRule struct {
	Alert       string            `json:"alert"`
	Expr        string            `json:"expr"`
	For         string            `json:"for"`
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations"`
}

type prometheusRule struct {
	APIVersion string            `json:"apiVersion"`
	Kind       string            `json:"kind"`
	Metadata   metav1.ObjectMeta `json:"metadata"`
	Spec       struct {
		Groups []struct {
			Name  string      `json:"name"`
			Rules []alertRule `json:"rules"`
		} `json:"groups"`
	} `json:"spec"`
}

type monitoring struct {
	serviceMonitors []monitor
	podMonitors     []monitor
	rules           []prometheusRule
	dashboard       map[string]any
}

func buildMonitoring(t *testing.T) monitoring {
	t.Helper()
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	rm, err := k.Run(filesys.MakeFsOnDisk(), "monitoring")
	if err != nil {
		t.Fatalf("kustomize build monitoring: %v", err)
	}
	var m monitoring
	for _, r := range rm.Resources() {
		y, err := r.AsYAML()
		if err != nil {
			t.Fatal(err)
		}
		var target any
		switch r.GetKind() {
		case "ServiceMonitor":
			m.serviceMonitors = append(m.serviceMonitors, monitor{})
			target = &m.serviceMonitors[len(m.serviceMonitors)-1]
		case "PodMonitor":
			m.podMonitors = append(m.podMonitors, monitor{})
			target = &m.podMonitors[len(m.podMonitors)-1]
		case "PrometheusRule":
			m.rules = append(m.rules, prometheusRule{})
			target = &m.rules[len(m.rules)-1]
		case "ConfigMap":
			data := r.GetDataMap()
			if data["dashboard.json"] == "" || r.GetLabels()["grafana_dashboard"] != "1" {
				t.Fatalf("ConfigMap %s: want dashboard.json, labelled grafana_dashboard", r.GetName())
			}
			if err := json.Unmarshal([]byte(data["dashboard.json"]), &m.dashboard); err != nil {
				t.Fatalf("dashboard.json: %v", err)
			}
			continue
		default:
			t.Fatalf("monitoring: kind %q has no check here", r.GetKind())
		}
		if r.GetApiVersion() != "monitoring.coreos.com/v1" {
			t.Errorf("%s %s: apiVersion %s, want monitoring.coreos.com/v1", r.GetKind(), r.GetName(), r.GetApiVersion())
		}
		if err := yaml.UnmarshalStrict(y, target); err != nil {
			t.Fatalf("%s %s does not match the Prometheus Operator's API as used here: %v", r.GetKind(), r.GetName(), err)
		}
	}
	return m
}

func checkEndpoints(t *testing.T, what string, eps []monitorEndpoint, ports []string) {
	t.Helper()
	if len(eps) == 0 {
		t.Errorf("%s: no endpoints", what)
	}
	for _, e := range eps {
		if !slices.Contains(ports, e.Port) {
			t.Errorf("%s: port %q is none of %v", what, e.Port, ports)
		}
		if e.Path != "/metrics" {
			t.Errorf("%s: path %q, want /metrics", what, e.Path)
		}
		if _, err := time.ParseDuration(e.Interval); err != nil {
			t.Errorf("%s: interval: %v", what, err)
		}
	}
}

func matches(t *testing.T, sel metav1.LabelSelector, l map[string]string) bool {
	t.Helper()
	s, err := metav1.LabelSelectorAsSelector(&sel)
	if err != nil {
		t.Fatal(err)
	}
	return !s.Empty() && s.Matches(labels.Set(l))
}

// The monitors scrape what the kustomizations deploy: the shared Service's
// metrics port, the sidecar's and etcd's metrics ports.
func TestMonitorsSelectTheDeployedMetricsPorts(t *testing.T) {
	m := buildMonitoring(t)
	shared, sidecar := build(t, "kustomize/shared"), build(t, "kustomize/sidecar")
	if len(m.serviceMonitors) != 1 {
		t.Fatalf("%d ServiceMonitors, want coordinatord", len(m.serviceMonitors))
	}
	sm := m.serviceMonitors[0]
	var selected []string
	for _, s := range shared.services {
		if !matches(t, sm.Spec.Selector, s.Labels) {
			continue
		}
		selected = append(selected, s.Name)
		var ports []string
		for _, p := range s.Spec.Ports {
			ports = append(ports, p.Name)
		}
		checkEndpoints(t, "ServiceMonitor "+sm.Metadata.Name+" on Service "+s.Name, sm.Spec.Endpoints, ports)
	}
	if !slices.Equal(selected, []string{"coordinatord"}) {
		t.Errorf("the ServiceMonitor selects Services %v, want [coordinatord] (one scrape per replica)", selected)
	}
	pods := map[string]struct {
		labels map[string]string
		ports  []string
	}{}
	podOf := func(name string, l map[string]string, spec []string) {
		pods[name] = struct {
			labels map[string]string
			ports  []string
		}{l, spec}
	}
	app := sidecar.deployments[0].Spec.Template
	podOf("sidecar", app.Labels, portNames(append(slices.Clone(app.Spec.Containers), app.Spec.InitContainers...)))
	etcd := shared.statefulSets[0].Spec.Template
	podOf("etcd", etcd.Labels, portNames(etcd.Spec.Containers))
	want := map[string]string{"coordinatord-sidecar": "sidecar", "etcd": "etcd"}
	if len(m.podMonitors) != len(want) {
		t.Fatalf("%d PodMonitors, want %d", len(m.podMonitors), len(want))
	}
	for _, pm := range m.podMonitors {
		p, ok := pods[want[pm.Metadata.Name]]
		if !ok {
			t.Errorf("unexpected PodMonitor %s", pm.Metadata.Name)
			continue
		}
		if !matches(t, pm.Spec.Selector, p.labels) {
			t.Errorf("PodMonitor %s does not select pods labelled %v", pm.Metadata.Name, p.labels)
		}
		checkEndpoints(t, "PodMonitor "+pm.Metadata.Name, pm.Spec.PodMetricsEndpoints, p.ports)
	}
}

// The alerts the operations guide promises exist, each complete.
func TestAlertRules(t *testing.T) {
	m := buildMonitoring(t)
	alerts := map[string]alertRule{}
	for _, r := range m.rules {
		for _, g := range r.Spec.Groups {
			for _, a := range g.Rules {
				alerts[a.Alert] = a
				if a.Alert == "" || strings.TrimSpace(a.Expr) == "" {
					t.Errorf("group %s: a rule without alert name or expr: %+v", g.Name, a)
				}
				if _, err := time.ParseDuration(a.For); err != nil {
					t.Errorf("%s: for: %v", a.Alert, err)
				}
				if s := a.Labels["severity"]; s != "warning" && s != "critical" {
					t.Errorf("%s: severity %q, want warning or critical", a.Alert, s)
				}
				if a.Annotations["summary"] == "" || a.Annotations["description"] == "" {
					t.Errorf("%s: needs a summary and a description", a.Alert)
				}
			}
		}
	}
	for _, want := range []string{
		"CoordinatordEtcdUnreachable", "EtcdNoLeader", // etcd unavailable / the replica not ready
		"CoordinatordValidationFailuresRising", "CoordinatordExpirationsWhileHeld",
		"EtcdStoreFull", "CoordinatordResourceExhausted", // STORE_FULL and quotas
		"CoordinatordEpochPaused", "CoordinatordEtcdRestored", // the token epoch: paused, raised after a restore
	} {
		if _, ok := alerts[want]; !ok {
			t.Errorf("no alert %s", want)
		}
	}
}

func portNames(cs []corev1.Container) []string {
	var out []string
	for _, c := range cs {
		for _, p := range c.Ports {
			out = append(out, p.Name)
		}
	}
	return out
}
