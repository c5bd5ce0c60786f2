package deploy_test

// The shard core's manifests, run: the command lines of
// kustomize/shared-shard's members and of kustomize/sidecar-relay's relay,
// started as processes on loopback (127.0.0.1 standing in for the pod IP)
// with the files their volumes would hold, and called through with
// coordctl as the example application would: mutual TLS to the relay.

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// goBuild builds a command of the repository (../pkg) into dir.
func goBuild(t *testing.T, dir, pkg string) string {
	t.Helper()
	out := filepath.Join(dir, filepath.Base(pkg))
	cmd := exec.Command("go", "build", "-o", out, pkg)
	cmd.Dir = ".."
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build %s: %v\n%s", pkg, err, b)
	}
	return out
}

// testCA issues the certificates of one CA.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  string
}

func newTestCA(t *testing.T) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "coordinatord-ca"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &testCA{cert: cert, key: key, pem: string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))}
}

// leaf issues a certificate (PEM) and its key (PEM).
func (ca *testCA) leaf(t *testing.T, cn string, uri string, ips []net.IP, usage ...x509.ExtKeyUsage) (string, string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial, err := rand.Int(rand.Reader, big.NewInt(1<<62))
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial, Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: usage, IPAddresses: ips,
	}
	if uri != "" {
		u, err := url.Parse(uri)
		if err != nil {
			t.Fatal(err)
		}
		tmpl.URIs = []*url.URL{u}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})),
		string(pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}))
}

// freePort is a TCP port free on 127.0.0.1 a moment ago.
func freePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
}

// localProcess is a daemon of the test, its output in a file.
type localProcess struct {
	name string
	cmd  *exec.Cmd
	log  string
}

func (p *localProcess) tail() string {
	b, _ := os.ReadFile(p.log)
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

// start runs bin with args and env (only env: no COORDINATORD_* of the
// test's environment leaks in), stopped with SIGTERM when the test ends.
func start(t *testing.T, name, bin string, args, env []string) *localProcess {
	t.Helper()
	p := &localProcess{name: name, log: filepath.Join(t.TempDir(), name+".log")}
	f, err := os.Create(p.log)
	if err != nil {
		t.Fatal(err)
	}
	p.cmd = exec.Command(bin, args...)
	p.cmd.Env, p.cmd.Stdout, p.cmd.Stderr = append([]string{}, env...), f, f
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = p.cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			_ = p.cmd.Process.Kill()
			<-done
		}
		f.Close()
		if t.Failed() {
			t.Logf("%s's log (%v):\n%s", name, p.cmd.ProcessState, p.tail())
		}
	})
	return p
}

// startEtcd starts a plain etcd on loopback (coordbench's etcd child: the
// etcd server the daemon is built with) and returns its client URL. The
// manifests' etcd TLS and user are not run here: internal/daemon's
// etcdsec_test.go runs those.
func startEtcd(t *testing.T, coordbench string) string {
	t.Helper()
	cmd := exec.Command(coordbench, "child-etcd", "-data-dir", filepath.Join(t.TempDir(), "etcd"))
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { // it stops when its stdin closes
		stdin.Close()
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	})
	ready := make(chan string, 1)
	go func() {
		line, _ := bufio.NewReader(stdout).ReadString('\n')
		ready <- line
		_, _ = io.Copy(io.Discard, stdout)
	}()
	select {
	case line := <-ready:
		f := strings.Fields(line)
		if len(f) < 2 || f[0] != "READY" {
			t.Fatalf("etcd child: %q; stderr %s", line, stderr.String())
		}
		return f[1]
	case <-time.After(90 * time.Second):
		t.Fatalf("etcd child not ready after 90s; stderr %s", stderr.String())
	}
	return ""
}

// localArgs turns the args of container c of pod into a local command
// line: every file its volumes would hold written from sources (Secret or
// ConfigMap name -> key -> content) into a directory; the gRPC port
// (7070) replaced by grpc and $(POD_IP) by 127.0.0.1, as Kubernetes
// expands it; the health and metrics listeners on loopback; etcd the
// local one, without the manifests' etcd TLS and user.
func localArgs(t *testing.T, pod corev1.PodSpec, c corev1.Container, sources map[string]map[string]string, grpc, metrics, etcd string) []string {
	t.Helper()
	dirs := map[string]string{} // mount path -> local directory
	for _, m := range c.VolumeMounts {
		for _, v := range pod.Volumes {
			if v.Name != m.Name {
				continue
			}
			var src string
			switch {
			case v.Secret != nil:
				src = v.Secret.SecretName
			case v.ConfigMap != nil:
				src = v.ConfigMap.Name
			}
			files, ok := sources[src]
			if !ok {
				continue // etcd's: not used here
			}
			dir := t.TempDir()
			for k, content := range files {
				if err := os.WriteFile(filepath.Join(dir, k), []byte(content), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			dirs[m.MountPath] = dir
		}
	}
	var out []string
	for _, a := range c.Args {
		name, v, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
		switch name {
		case "etcd-endpoints", "etcd-ca", "etcd-cert", "etcd-key", "etcd-username", "etcd-password-file":
			continue
		case "listen", "advertise":
			v = strings.ReplaceAll(v, "$(POD_IP)", "127.0.0.1")
			host, port, err := net.SplitHostPort(v)
			if err != nil || port != "7070" {
				t.Fatalf("--%s=%s: want host:7070", name, v)
			}
			if host == "0.0.0.0" {
				host = "127.0.0.1"
			}
			v = net.JoinHostPort(host, grpc)
		case "health-listen":
			v = "127.0.0.1:0"
		case "metrics-listen":
			v = "127.0.0.1:" + metrics
		}
		for mount, dir := range dirs {
			if rest, ok := strings.CutPrefix(v, mount+"/"); ok {
				v = filepath.Join(dir, rest)
			}
		}
		if strings.Contains(v, "/etc/") {
			t.Fatalf("--%s=%s: no local file for it", name, v)
		}
		out = append(out, "--"+name+"="+v)
	}
	return append(out, "--etcd-endpoints="+etcd)
}

var shardsServing = regexp.MustCompile(`(?m)^coordinatord_shards_serving (\d+)`)

// serving is a member's coordinatord_shards_serving, -1 if unknown.
func serving(metrics string) int {
	resp, err := http.Get("http://127.0.0.1:" + metrics + "/metrics")
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	m := shardsServing.FindSubmatch(b)
	if m == nil {
		return -1
	}
	n, _ := strconv.Atoi(string(m[1]))
	return n
}

// The members of kustomize/shared-shard and the relay of
// kustomize/sidecar-relay, as the manifests run them: the members share
// the shards and forward to each other over mutual TLS (certificates
// naming the "pod IP"), the relay forwards every call of an authorized
// caller to the owning member with the member secret, and a caller the
// policy does not allow is refused.
func TestShardCoreCommandLinesRun(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd, two members and a relay")
	}
	daemon := daemonBinary(t)
	bins := t.TempDir()
	coordctl, coordbench := goBuild(t, bins, "./cmd/coordctl"), goBuild(t, bins, "./cmd/coordbench")

	cell := build(t, "kustomize/shared-shard")
	mpod := cell.deployments[0].Spec.Template.Spec
	member := container(t, mpod, "coordinatord")
	app := build(t, "kustomize/sidecar-relay")
	rpod := app.deployments[0].Spec.Template.Spec
	relay := container(t, rpod, "coordinatord")
	var policy string
	for _, cm := range cell.configMaps {
		if strings.HasPrefix(cm.Name, "coordinatord-policy") {
			policy = cm.Data["policy.json"]
		}
	}
	if policy == "" {
		t.Fatal("no policy ConfigMap in kustomize/shared-shard")
	}

	// The certificates deploy/README.md asks for: members' and the relay's
	// name the address they are dialled at (the pod IP; 127.0.0.1 for the
	// relay's loopback listener) and serve and authenticate as clients.
	ca := newTestCA(t)
	loopback := []net.IP{net.IPv4(127, 0, 0, 1)}
	both := []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
	memberCrt, memberKey := ca.leaf(t, "coordinatord", "", loopback, both...)
	relayCrt, relayKey := ca.leaf(t, "coordinatord-relay", "", loopback, both...)
	aliceCrt, aliceKey := ca.leaf(t, "team-a", "spiffe://cluster.local/ns/team-a/sa/worker", nil, x509.ExtKeyUsageClientAuth)
	secret := "0123456789abcdef0123456789abcdef\n" // openssl rand -hex 16, say
	sources := map[string]map[string]string{
		"coordinatord-tls":           {"ca.crt": ca.pem, "tls.crt": memberCrt, "tls.key": memberKey},
		"coordinatord-member-secret": {"secret": secret},
		"coordinatord-relay-tls":     {"ca.crt": ca.pem, "tls.crt": relayCrt, "tls.key": relayKey},
		"coordinatord-policy-relay":  {"policy.json": policy},
	}
	for _, cm := range cell.configMaps {
		sources[cm.Name] = cm.Data
	}

	etcd := startEtcd(t, coordbench)
	var metrics []string
	var members []string
	for i := range 2 {
		g, m := freePort(t), freePort(t)
		members, metrics = append(members, "127.0.0.1:"+g), append(metrics, m)
		start(t, fmt.Sprintf("member-%d", i), daemon, localArgs(t, mpod, member, sources, g, m, etcd), nil)
	}
	// The relay's settings from its ConfigMap, but etcd's.
	var env []string
	for k, v := range sidecarEnv(t, app) {
		if k != "COORDINATORD_ETCD_ENDPOINTS" && k != "COORDINATORD_ETCD_USERNAME" {
			env = append(env, k+"="+v)
		}
	}
	relayAddr := "127.0.0.1:" + freePort(t)
	_, rport, _ := net.SplitHostPort(relayAddr)
	start(t, "relay", daemon, localArgs(t, rpod, relay, sources, rport, freePort(t), etcd), env)

	// Both members own shards, all 256 of them between the two.
	deadline := time.Now().Add(90 * time.Second)
	for {
		a, b := serving(metrics[0]), serving(metrics[1])
		if a > 0 && b > 0 && a+b == 256 {
			t.Logf("members serve %d and %d shards", a, b)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("members serve %d and %d shards after 90s; want both some, 256 in all", a, b)
		}
		time.Sleep(200 * time.Millisecond)
	}

	ctl := t.TempDir()
	for name, content := range map[string]string{"ca.crt": ca.pem, "tls.crt": aliceCrt, "tls.key": aliceKey} {
		if err := os.WriteFile(filepath.Join(ctl, name), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	call := func(addr string, args ...string) (string, int) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, coordctl, append([]string{"--addr=" + addr, "--timeout=10s", "-o=json",
			"--tls-ca=" + filepath.Join(ctl, "ca.crt"), "--tls-cert=" + filepath.Join(ctl, "tls.crt"), "--tls-key=" + filepath.Join(ctl, "tls.key")}, args...)...)
		cmd.Env = []string{}
		out, err := cmd.CombinedOutput()
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return string(out), ee.ExitCode()
		}
		if err != nil {
			t.Fatalf("coordctl %v: %v", args, err)
		}
		return string(out), 0
	}
	// Acquire through the relay (it owns nothing: every call is forwarded),
	// then see each grant from both members (one owns the name's shard, the
	// other forwards to it).
	tokens := map[string]string{}
	for i := range 24 {
		name := fmt.Sprintf("team-a/job-%d", i)
		out, code := call(relayAddr, "acquire", name, "--ttl=60s")
		var g struct{ Token string }
		if code != 0 || json.Unmarshal([]byte(out), &g) != nil || g.Token == "" {
			t.Fatalf("acquire %s through the relay: exit %d: %s", name, code, out)
		}
		tokens[name] = g.Token
	}
	for name, token := range tokens {
		for _, m := range members {
			out, code := call(m, "describe", name)
			var d struct{ Holder struct{ Token string } }
			if code != 0 || json.Unmarshal([]byte(out), &d) != nil || d.Holder.Token != token {
				t.Errorf("describe %s on member %s: exit %d: %s; want the holder of token %s", name, m, code, out, token)
			}
		}
	}
	out, code := call(relayAddr, "list", "team-a/")
	var l struct{ Holders []struct{ Name string } }
	if code != 0 || json.Unmarshal([]byte(out), &l) != nil || len(l.Holders) != len(tokens) {
		t.Errorf("list team-a/ through the relay: exit %d: %s; want %d holders", code, out, len(tokens))
	}
	// team-a's identity may not take team-b's locks: refused, by the relay
	// and by the members.
	for _, addr := range append([]string{relayAddr}, members...) {
		if out, code := call(addr, "acquire", "team-b/job", "--ttl=60s"); code != 6 {
			t.Errorf("acquire team-b/job as team-a at %s: exit %d (%s); want 6, denied", addr, code, out)
		}
	}
}
