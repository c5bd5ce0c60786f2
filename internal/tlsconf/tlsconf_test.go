package tlsconf

import (
	"crypto/tls"
	"errors"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/coordinatord/coordinatord/internal/testpki"
)

// handshake dials a TLS listener served with cfg and reports the handshake's
// error as seen by the client.
func handshake(t *testing.T, cfg *tls.Config, client *tls.Config) error {
	t.Helper()
	lis, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	done := make(chan struct{})
	go func() {
		defer close(done)
		c, err := lis.Accept()
		if err != nil {
			return
		}
		_ = c.(*tls.Conn).Handshake()
		c.Close()
	}()
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", lis.Addr().String(), client)
	if err == nil {
		// TLS 1.3 reports a refused client certificate on the first read.
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, err = c.Read(make([]byte, 1))
		if errors.Is(err, os.ErrDeadlineExceeded) || err != nil && err.Error() == "EOF" {
			err = nil
		}
		c.Close()
	}
	lis.Close()
	<-done
	return err
}

func TestServerReloadsRotatedFiles(t *testing.T) {
	old := checkEvery
	checkEvery = 0
	t.Cleanup(func() { checkEvery = old })

	dir := t.TempDir()
	ca1, ca2 := testpki.NewCA("first"), testpki.NewCA("second")
	certFile, keyFile := ca1.Localhost().Write(dir, "server")
	caFile := ca1.WriteCA(dir, "clients")
	s, err := NewServer(certFile, keyFile, caFile)
	if err != nil {
		t.Fatal(err)
	}
	var reloadErr error
	s.OnReloadError = func(err error) { reloadErr = err }
	if !s.MutualTLS() {
		t.Fatal("MutualTLS() = false with a client CA")
	}
	client1 := &tls.Config{RootCAs: ca1.Pool(), ServerName: "localhost", Certificates: []tls.Certificate{ca1.Issue(testpki.Leaf{CN: "c"}).TLS()}}
	client2 := &tls.Config{RootCAs: ca2.Pool(), ServerName: "localhost", Certificates: []tls.Certificate{ca2.Issue(testpki.Leaf{CN: "c"}).TLS()}}
	if err := handshake(t, s.Config(), client1); err != nil {
		t.Fatalf("before rotation, a client of the first CA: %v", err)
	}
	if err := handshake(t, s.Config(), client2); err == nil {
		t.Fatal("before rotation, a client of the second CA was accepted")
	}

	// Rotate everything to the second CA; make sure the mtime moves.
	time.Sleep(10 * time.Millisecond)
	ca2.Localhost().Write(dir, "server")
	ca2.WriteCA(dir, "clients")
	if err := handshake(t, s.Config(), client2); err != nil {
		t.Fatalf("after rotation, a client of the second CA: %v", err)
	}
	if err := handshake(t, s.Config(), client1); err == nil {
		t.Fatal("after rotation, a client of the first CA was still accepted")
	}

	// A broken rotation keeps serving the last good files.
	if err := os.WriteFile(filepath.Join(dir, "server.key"), []byte("garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := handshake(t, s.Config(), client2); err != nil {
		t.Fatalf("after a broken rotation: %v", err)
	}
	if reloadErr == nil {
		t.Fatal("a broken rotation was not reported")
	}
}

func TestNewServerAndClientErrors(t *testing.T) {
	dir := t.TempDir()
	ca := testpki.NewCA("ca")
	cert, key := ca.Localhost().Write(dir, "s")
	if _, err := NewServer(cert, "", ""); err == nil {
		t.Error("NewServer without a key: no error")
	}
	if _, err := NewServer(cert, filepath.Join(dir, "missing"), ""); err == nil {
		t.Error("NewServer with a missing key: no error")
	}
	if _, err := NewServer(cert, key, cert+".nope"); err == nil {
		t.Error("NewServer with a missing CA: no error")
	}
	if c, err := Client("", "", ""); c != nil || err != nil {
		t.Errorf("Client with nothing = %v, %v; want nil, nil", c, err)
	}
	if _, err := Client("", cert, ""); err == nil {
		t.Error("Client with a certificate but no key: no error")
	}
	c, err := Client(ca.WriteCA(dir, "ca"), cert, key)
	if err != nil || c.RootCAs == nil || len(c.Certificates) != 1 || c.MinVersion != tls.VersionTLS12 {
		t.Errorf("Client = %+v, %v", c, err)
	}
}
