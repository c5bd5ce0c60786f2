package embedetcd

import (
	"context"
	"crypto/tls"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// Issue 13 row 9: the member used to serve clients on 127.0.0.1 with no
// authentication, so any local process could delete a held lock's key. Now
// no TCP port of the member answers a client that lacks the member's own
// certificate, and its client socket sits in a directory only its owner may
// enter; the daemon itself (Endpoints) still reads and writes.
func TestOtherLocalClientsCannotReachTheMember(t *testing.T) {
	s, err := Start(context.Background(), t.TempDir(), WithFastElection())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()

	own := dial(t, s.Endpoints())
	if _, err := own.Put(context.Background(), "/locks/held", "x"); err != nil {
		t.Fatalf("the daemon's own client cannot write: %v", err)
	}

	// Every TCP address a local process could find by scanning loopback.
	var addrs []string
	for _, l := range s.etcd.Peers {
		addrs = append(addrs, l.Addr().String())
	}
	for _, l := range s.etcd.Clients {
		if l.Addr().Network() == "tcp" {
			addrs = append(addrs, l.Addr().String())
		}
	}
	for _, addr := range addrs {
		t.Run("tcp "+addr, func(t *testing.T) {
			for _, scheme := range []string{"http", "https"} {
				c := dial(t, []string{scheme + "://" + addr})
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				_, err := c.Delete(ctx, "/locks/held")
				cancel()
				if err == nil {
					t.Fatalf("a plain %s client deleted a key through %s", scheme, addr)
				}
			}
			// The peer API (raft messages, lease renewals, member list)
			// needs the member's client certificate: a TLS client without
			// one is refused at the handshake.
			hc := &http.Client{Timeout: time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
			for _, scheme := range []string{"http", "https"} {
				resp, err := hc.Get(scheme + "://" + addr + "/members")
				if err == nil {
					resp.Body.Close()
					if resp.StatusCode == http.StatusOK {
						t.Fatalf("GET %s://%s/members answered 200 without a client certificate", scheme, addr)
					}
				}
			}
		})
	}

	t.Run("unix socket", func(t *testing.T) {
		ep := s.Endpoints()[0]
		path, ok := strings.CutPrefix(ep, "unix://")
		if !ok {
			t.Fatalf("endpoint %q is not a unix socket", ep)
		}
		fi, err := os.Stat(filepath.Dir(path))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o700 || fi.Sys().(*syscall.Stat_t).Uid != uint32(os.Getuid()) {
			t.Fatalf("socket directory %s: mode %v uid %d, want 0700 and owner %d", filepath.Dir(path), fi.Mode().Perm(), fi.Sys().(*syscall.Stat_t).Uid, os.Getuid())
		}
		if os.Getuid() != 0 {
			return // another user cannot be tried without root; the mode above is what keeps them out
		}
		// As root, try for real as another user (nobody): the test binary,
		// copied where nobody may run it, dials the socket.
		out, err := asNobody(t, path)
		if err == nil {
			t.Fatalf("another user reached the member through %s: %s", path, out)
		}
		if !strings.Contains(string(out), "permission denied") {
			t.Fatalf("another user's attempt failed, but not for want of permission: %v: %s", err, out)
		}
	})
}

// asNobody runs this test binary as uid 65534 in its dial-only mode
// (TestHelperDialAsOtherUser) against socket path.
func asNobody(t *testing.T, path string) ([]byte, error) {
	t.Helper()
	dir, err := os.MkdirTemp("", "embedetcd-nobody")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	bin, err := os.ReadFile(exe)
	if err != nil {
		t.Fatal(err)
	}
	copyExe := filepath.Join(dir, "embedetcd.test")
	if err := os.WriteFile(copyExe, bin, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(copyExe, "-test.run=^TestHelperDialAsOtherUser$", "-test.count=1")
	cmd.Env = append(os.Environ(), "EMBEDETCD_DIAL="+path)
	cmd.Dir = dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	return cmd.CombinedOutput()
}

// TestHelperDialAsOtherUser is asNobody's child: it connects to the socket
// named by EMBEDETCD_DIAL and fails the way the kernel refuses it.
func TestHelperDialAsOtherUser(t *testing.T) {
	path := os.Getenv("EMBEDETCD_DIAL")
	if path == "" {
		t.Skip("only run by asNobody")
	}
	if _, err := os.Stat(path); err != nil {
		t.Fatal(err) // "permission denied" from the 0700 directory
	}
	c := dial(t, []string{"unix://" + path})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if _, err := c.Delete(ctx, "/locks/held"); err != nil {
		t.Fatal(err)
	}
}

func dial(t *testing.T, eps []string) *clientv3.Client {
	t.Helper()
	c, err := clientv3.New(clientv3.Config{Endpoints: eps, DialTimeout: time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}
