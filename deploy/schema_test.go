package deploy_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"

	"k8s.io/kube-openapi/pkg/validation/spec"
	"k8s.io/kube-openapi/pkg/validation/strfmt"
	"k8s.io/kube-openapi/pkg/validation/validate"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/kustomize/kyaml/openapi"
	kyaml "sigs.k8s.io/kustomize/kyaml/yaml"
)

// The Kubernetes OpenAPI (swagger) definitions embedded in kustomize's kyaml
// (Kubernetes v1.21.2, the only built-in version), validated with
// kube-openapi's validator: types, formats and required fields of every
// built resource. No download: both come from the Go module proxy. The
// schema knows no field newer than v1.21 (gRPC probes, for one) and, like
// every Kubernetes swagger, does not forbid unknown fields: the strict
// decoding into the current API types in manifests_test.go covers those.

var (
	defsOnce sync.Once
	defs     map[string]any // definition name -> schema, as JSON values
	defsErr  error
)

func k8sDefinitions(t *testing.T) map[string]any {
	t.Helper()
	defsOnce.Do(func() {
		b, err := json.Marshal(openapi.Schema().Definitions)
		if err == nil {
			err = json.Unmarshal(b, &defs)
		}
		if err == nil && len(defs) == 0 {
			err = fmt.Errorf("kyaml embeds no Kubernetes definitions")
		}
		if defsErr = err; err != nil {
			return
		}
		// Kubernetes decodes these specially; its swagger types them as plain
		// strings. An int-or-string accepts both, a quantity a number too.
		defs["io.k8s.apimachinery.pkg.util.intstr.IntOrString"] = map[string]any{
			"anyOf": []any{map[string]any{"type": "integer"}, map[string]any{"type": "string"}}}
		defs["io.k8s.apimachinery.pkg.api.resource.Quantity"] = map[string]any{
			"anyOf": []any{map[string]any{"type": "number"}, map[string]any{"type": "string"}}}
	})
	if defsErr != nil {
		t.Fatalf("Kubernetes OpenAPI definitions: %v", defsErr)
	}
	return defs
}

// expand inlines every $ref of v; a reference to a definition being
// expanded (a recursive type) becomes an empty schema, which accepts
// anything.
func expand(v any, defs map[string]any, open map[string]bool) any {
	switch x := v.(type) {
	case map[string]any:
		if ref, ok := x["$ref"].(string); ok {
			name := strings.TrimPrefix(ref, "#/definitions/")
			if open[name] || defs[name] == nil {
				return map[string]any{}
			}
			open[name] = true
			out := expand(defs[name], defs, open)
			delete(open, name)
			return out
		}
		out := make(map[string]any, len(x))
		for k, e := range x {
			out[k] = expand(e, defs, open)
		}
		return out
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = expand(e, defs, open)
		}
		return out
	}
	return v
}

var (
	schemaMu    sync.Mutex
	schemaCache = map[string]*spec.Schema{}
)

// schemaOf returns the expanded schema of apiVersion/kind.
func schemaOf(t *testing.T, apiVersion, kind string) *spec.Schema {
	t.Helper()
	defs := k8sDefinitions(t)
	schemaMu.Lock()
	defer schemaMu.Unlock()
	key := apiVersion + "/" + kind
	if s, ok := schemaCache[key]; ok {
		return s
	}
	rs := openapi.SchemaForResourceType(kyaml.TypeMeta{APIVersion: apiVersion, Kind: kind})
	if rs == nil || rs.Schema == nil {
		t.Fatalf("no Kubernetes schema for %s", key)
	}
	b, err := json.Marshal(rs.Schema)
	if err != nil {
		t.Fatal(err)
	}
	var raw any
	if err := json.Unmarshal(b, &raw); err != nil {
		t.Fatal(err)
	}
	b, err = json.Marshal(expand(raw, defs, map[string]bool{}))
	if err != nil {
		t.Fatal(err)
	}
	s := new(spec.Schema)
	if err := json.Unmarshal(b, s); err != nil {
		t.Fatal(err)
	}
	schemaCache[key] = s
	return s
}

// validateObject checks one resource (JSON values) against its schema.
func validateObject(t *testing.T, obj map[string]any) []error {
	t.Helper()
	apiVersion, _ := obj["apiVersion"].(string)
	kind, _ := obj["kind"].(string)
	s := schemaOf(t, apiVersion, kind)
	return validate.NewSchemaValidator(s, nil, kind, strfmt.Default).Validate(obj).Errors
}

// Every resource of every kustomization matches the Kubernetes schema.
func TestManifestsMatchTheKubernetesSchema(t *testing.T) {
	for _, dir := range []string{"kustomize/etcd", "kustomize/shared", "kustomize/shared-shard", "kustomize/sidecar", "kustomize/sidecar-relay", "monitoring"} {
		t.Run(dir, func(t *testing.T) {
			k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
			rm, err := k.Run(filesys.MakeFsOnDisk(), dir)
			if err != nil {
				t.Fatalf("kustomize build: %v", err)
			}
			if len(rm.Resources()) == 0 {
				t.Fatal("no resources")
			}
			for _, r := range rm.Resources() {
				// The Prometheus Operator's CRDs (ServiceMonitor, PodMonitor,
				// PrometheusRule) are not in the Kubernetes schema: they are
				// decoded strictly and checked in monitoring_test.go instead.
				if strings.HasPrefix(r.GetApiVersion(), "monitoring.coreos.com/") {
					continue
				}
				obj, err := r.Map()
				if err != nil {
					t.Fatal(err)
				}
				// Through JSON: the validator expects JSON values.
				b, err := json.Marshal(obj)
				if err != nil {
					t.Fatal(err)
				}
				var v map[string]any
				if err := json.Unmarshal(b, &v); err != nil {
					t.Fatal(err)
				}
				for _, err := range validateObject(t, v) {
					t.Errorf("%s %s: %v", r.GetKind(), r.GetName(), err)
				}
			}
		})
	}
}

// The schema check catches what a hand-edited manifest gets wrong.
func TestSchemaCatchesBrokenManifests(t *testing.T) {
	const good = `{"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"},
		"spec": {"replicas": 3, "selector": {"matchLabels": {"app": "d"}},
			"template": {"metadata": {"labels": {"app": "d"}}, "spec": {"containers": [
				{"name": "c", "image": "i", "ports": [{"containerPort": 7070}],
				 "resources": {"requests": {"cpu": "100m", "memory": 1048576}},
				 "readinessProbe": {"httpGet": {"port": "http", "path": "/readyz"}}}]}}}}`
	for _, tc := range []struct {
		name   string
		edit   func(d map[string]any)
		broken bool
	}{
		{"valid", func(map[string]any) {}, false},
		{"replicas is a string", func(d map[string]any) { specOf(d)["replicas"] = "three" }, true},
		{"container without a name", func(d map[string]any) { delete(firstContainer(d), "name") }, true},
		{"no selector", func(d map[string]any) { delete(specOf(d), "selector") }, true},
		{"containerPort is a string", func(d map[string]any) {
			firstContainer(d)["ports"] = []any{map[string]any{"containerPort": "7070"}}
		}, true},
		{"env is an object", func(d map[string]any) { firstContainer(d)["env"] = map[string]any{"A": "b"} }, true},
		{"no containers", func(d map[string]any) {
			specOf(d)["template"].(map[string]any)["spec"] = map[string]any{}
		}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var d map[string]any
			if err := json.Unmarshal([]byte(good), &d); err != nil {
				t.Fatal(err)
			}
			tc.edit(d)
			errs := validateObject(t, d)
			if tc.broken && len(errs) == 0 {
				t.Error("not caught")
			}
			if !tc.broken && len(errs) > 0 {
				t.Errorf("a valid Deployment is refused: %v", errs)
			}
		})
	}
}

func specOf(d map[string]any) map[string]any { return d["spec"].(map[string]any) }

func firstContainer(d map[string]any) map[string]any {
	pod := specOf(d)["template"].(map[string]any)["spec"].(map[string]any)
	return pod["containers"].([]any)[0].(map[string]any)
}
