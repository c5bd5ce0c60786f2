package deploy_test

// The queries of the alert rules and the dashboard read only metrics that
// coordinatord or etcd export.

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// queries returns every PromQL query of the rules and the dashboard (its
// panels' targets and its variables' label_values), by where they are.
func queries(t *testing.T, m monitoring) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, r := range m.rules {
		for _, g := range r.Spec.Groups {
			for _, a := range g.Rules {
				out["rule "+a.Alert] = a.Expr
			}
		}
	}
	panels, _ := m.dashboard["panels"].([]any)
	if len(panels) == 0 {
		t.Fatal("dashboard.json has no panels")
	}
	for _, p := range panels {
		p := p.(map[string]any)
		targets, _ := p["targets"].([]any)
		if len(targets) == 0 {
			t.Errorf("dashboard panel %q has no targets", p["title"])
		}
		for i, tg := range targets {
			e, _ := tg.(map[string]any)["expr"].(string)
			if e == "" {
				t.Errorf("dashboard panel %q target %d has no expr", p["title"], i)
			}
			out[fmt.Sprintf("panel %q target %d", p["title"], i)] = e
		}
	}
	tmpl, _ := m.dashboard["templating"].(map[string]any)
	vars, _ := tmpl["list"].([]any)
	for _, v := range vars {
		v := v.(map[string]any)
		if v["type"] != "query" {
			continue
		}
		q, _ := v["query"].(string)
		sub := labelValues.FindStringSubmatch(q)
		if sub == nil {
			t.Errorf("dashboard variable %s: query %q is not label_values(metric, label)", v["name"], q)
			continue
		}
		out[fmt.Sprintf("variable %s", v["name"])] = sub[1]
	}
	return out
}

var labelValues = regexp.MustCompile(`^label_values\(\s*([a-zA-Z_:][a-zA-Z0-9_:]*)\s*,\s*[a-zA-Z_][a-zA-Z0-9_]*\s*\)$`)

var (
	promStrings  = regexp.MustCompile(`"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|` + "`[^`]*`")
	promMatchers = regexp.MustCompile(`\{[^}]*\}|\[[^\]]*\]`)
	promGrouping = regexp.MustCompile(`\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`)
	promToken    = regexp.MustCompile(`[a-zA-Z0-9_:.$]+`)
	promKeywords = []string{"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring",
		"group_left", "group_right", "atan2", "inf", "nan", "Inf", "NaN"}
)

// metricNames returns the metric names a PromQL query reads: its
// identifiers once strings, label matchers, ranges and grouping labels are
// removed, but for function and aggregation names (followed by a
// parenthesis), keywords and numbers. A tokenizer, not a parser (the
// Prometheus parser would bring the whole of Prometheus into this module);
// TestMetricNamesOfAQuery pins what it reads.
func metricNames(q string) []string {
	q = promStrings.ReplaceAllString(q, `""`)
	q = promMatchers.ReplaceAllString(q, " ")
	q = promGrouping.ReplaceAllString(q, " ")
	var out []string
	for _, loc := range promToken.FindAllStringIndex(q, -1) {
		tok := q[loc[0]:loc[1]]
		if tok[0] >= '0' && tok[0] <= '9' || tok[0] == '.' || tok[0] == '$' || slices.Contains(promKeywords, tok) {
			continue
		}
		if strings.HasPrefix(strings.TrimLeft(q[loc[1]:], " \t\n"), "(") {
			continue // a function or an aggregation
		}
		if !slices.Contains(out, tok) {
			out = append(out, tok)
		}
	}
	return out
}

func TestMetricNamesOfAQuery(t *testing.T) {
	for _, tc := range []struct{ q, want string }{
		{`coordinatord_locks_held`, "coordinatord_locks_held"},
		{`sum by (namespace, outcome) (rate(coordinatord_validations_total{outcome=~"fenced|not_held", namespace="$ns"}[5m])) > 0.05`, "coordinatord_validations_total"},
		{`histogram_quantile(0.99, sum(rate(grpc_server_handling_seconds_bucket[$__rate_interval])) by (le))`, "grpc_server_handling_seconds_bucket"},
		{`coordinatord_build_info unless on (namespace, pod) coordinatord_locks_held`, "coordinatord_build_info coordinatord_locks_held"},
		{`max(a / b) > 1e3 and c offset 5m`, "a b c"},
		{`sum by (namespace) (increase(r_total[10m])) > 0 or sum by (namespace) (r_total unless r_total offset 10m) > 0`, "r_total"},
		{`count by (version) (coordinatord_build_info{job=~"(.*/)?x"})`, "coordinatord_build_info"},
		{`(sum by (namespace) (increase(x_total[10m]) and on (namespace, pod) coordinatord_shards) or max by (namespace) (increase(x_total[10m]) unless on (namespace, pod) coordinatord_shards)) > 0`,
			"x_total coordinatord_shards"},
	} {
		if got := strings.Join(metricNames(tc.q), " "); got != tc.want {
			t.Errorf("metricNames(%q) = %q, want %q", tc.q, got, tc.want)
		}
	}
}

// Every query of the rules and the dashboard reads only metrics that exist:
// those a real coordinatord serves on /metrics, on either core (started
// here with its embedded etcd: every vector of the daemon is created with
// its usual series at zero), etcd's own (looked up in the etcd server
// sources the daemon is built with), and Prometheus' up. The shard core's
// are read too: the queries of the lock census and of the grant ends tell
// its replicas (sum) from the queue core's (max) by coordinatord_shards.
func TestQueriesNameExportedMetrics(t *testing.T) {
	m := buildMonitoring(t)
	exported := scrapeDaemon(t)
	for _, want := range []string{"coordinatord_build_info", "coordinatord_locks_held", "grpc_server_handled_total", "go_goroutines"} {
		if !exported[want] {
			t.Fatalf("the daemon's /metrics lacks %s: the scrape is broken", want)
		}
	}
	shardCore := scrapeDaemon(t, "-core=shard")
	for _, want := range []string{"coordinatord_shards", "coordinatord_locks_held", "coordinatord_expirations_total"} {
		if !shardCore[want] {
			t.Fatalf("the shard core's /metrics lacks %s: the scrape is broken", want)
		}
	}
	for n := range shardCore {
		exported[n] = true
	}
	etcdDir := etcdServerSources(t)
	for where, q := range queries(t, m) {
		names := metricNames(q)
		if len(names) == 0 {
			t.Errorf("%s: no metric in %q", where, q)
		}
		for _, n := range names {
			switch {
			case exported[n], n == "up":
			case strings.HasPrefix(n, "etcd_"):
				if !etcdExports(t, etcdDir, n) {
					t.Errorf("%s: etcd exports no metric %s", where, n)
				}
			default:
				t.Errorf("%s: coordinatord exports no metric %s (query %q)", where, n, q)
			}
		}
	}
}

// scrapeDaemon builds and starts coordinatord with an embedded etcd (and
// the extra flags) and returns the sample names of its /metrics once it
// exports its lock census (the queue core's reads etcd).
func scrapeDaemon(t *testing.T, flags ...string) map[string]bool {
	t.Helper()
	bin := daemonBinary(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	cmd := exec.Command(bin, append([]string{"-listen=127.0.0.1:0", "-metrics-listen=" + addr, "-data-dir=" + t.TempDir(), "-log-format=text"}, flags...)...)
	cmd.Stdout, cmd.Stderr = io.Discard, io.Discard
	// The flags above only: no COORDINATORD_* setting of the caller's.
	cmd.Env = slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "COORDINATORD_") })
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	defer func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-done:
			if err != nil {
				t.Logf("coordinatord after SIGTERM: %v", err)
			}
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			t.Errorf("coordinatord did not stop within 30s of SIGTERM: %v", <-done)
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for {
		names, err := scrape(ctx, "http://"+addr+"/metrics")
		if err == nil && names["coordinatord_locks_held"] {
			return names
		}
		select {
		case err := <-done:
			t.Fatalf("coordinatord exited: %v", err)
		case <-ctx.Done():
			t.Fatalf("no /metrics with the lock census from coordinatord within a minute: %v", err)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func scrape(ctx context.Context, url string) (map[string]bool, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	names := map[string]bool{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		if i := strings.IndexAny(line, "{ "); i > 0 {
			names[line[:i]] = true
		}
	}
	return names, sc.Err()
}

// etcdServerSources is the directory of the go.etcd.io/etcd/server/v3
// module the daemon is built with (from the module cache).
func etcdServerSources(t *testing.T) string {
	t.Helper()
	cmd := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "go.etcd.io/etcd/server/v3")
	cmd.Dir = ".."
	out, err := cmd.Output()
	dir := strings.TrimSpace(string(out))
	if err != nil || dir == "" {
		t.Fatalf("locate etcd's server module: %v", err)
	}
	return dir
}

// etcdExports reports whether etcd's sources define metric name as a
// prometheus option with Namespace "etcd", a Subsystem and a Name that
// join to it, in one file.
func etcdExports(t *testing.T, dir, name string) bool {
	t.Helper()
	rest := strings.TrimPrefix(name, "etcd_")
	found := false
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || found || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		src := string(b)
		if !regexp.MustCompile(`Namespace:\s*"etcd"`).MatchString(src) {
			return nil
		}
		for i := range len(rest) {
			if rest[i] != '_' {
				continue
			}
			sub, n := rest[:i], rest[i+1:]
			if regexp.MustCompile(`Subsystem:\s*"`+regexp.QuoteMeta(sub)+`"`).MatchString(src) &&
				regexp.MustCompile(`Name:\s*"`+regexp.QuoteMeta(n)+`"`).MatchString(src) {
				found = true
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return found
}
