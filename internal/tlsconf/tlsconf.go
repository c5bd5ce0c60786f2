// Package tlsconf builds the TLS configurations of the daemon: the gRPC
// server's (TLS or mutual TLS, files re-read when they change) and the etcd
// client's.
package tlsconf

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"
)

// checkEvery bounds how often the files are stat'ed for changes: at most
// once per interval, on a handshake.
var checkEvery = time.Second

// Server holds a server certificate and, for mutual TLS, the client CA
// bundle. It re-reads the files on a handshake when one of them has a new
// modification time or size, so rotated certificates are served without a
// restart. A rotation that does not load (half-written files, a key that
// does not match) keeps the previous certificate and reports the error to
// OnReloadError.
type Server struct {
	certFile, keyFile, caFile string
	// OnReloadError, if set, receives a failed reload's error.
	OnReloadError func(error)

	mu      sync.Mutex
	checked time.Time
	stamp   string
	cfg     *tls.Config
}

// NewServer loads certFile and keyFile (PEM) and, if caFile is not empty,
// the CA bundle that client certificates must chain to: then every client
// must present a valid certificate (mutual TLS).
func NewServer(certFile, keyFile, caFile string) (*Server, error) {
	if certFile == "" || keyFile == "" {
		return nil, errors.New("tls: a certificate and a key file are both required")
	}
	s := &Server{certFile: certFile, keyFile: keyFile, caFile: caFile}
	stamp, err := s.stampNow()
	if err != nil {
		return nil, err
	}
	cfg, err := s.load()
	if err != nil {
		return nil, err
	}
	s.cfg, s.stamp, s.checked = cfg, stamp, time.Now()
	return s, nil
}

// MutualTLS tells whether client certificates are required.
func (s *Server) MutualTLS() bool { return s.caFile != "" }

// Config is the tls.Config to serve with: TLS 1.2 at least (1.3 is
// preferred by Go's negotiation), and the current files.
func (s *Server) Config() *tls.Config {
	return &tls.Config{
		MinVersion:         tls.VersionTLS12,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) { return s.current(), nil },
	}
}

func (s *Server) current() *tls.Config {
	s.mu.Lock()
	defer s.mu.Unlock()
	if time.Since(s.checked) < checkEvery {
		return s.cfg
	}
	s.checked = time.Now()
	stamp, err := s.stampNow()
	if err != nil || stamp == s.stamp {
		return s.cfg
	}
	cfg, err := s.load()
	if err != nil {
		if s.OnReloadError != nil {
			s.OnReloadError(err)
		}
		return s.cfg
	}
	s.cfg, s.stamp = cfg, stamp
	return cfg
}

// stampNow summarises the files' modification times and sizes.
func (s *Server) stampNow() (string, error) {
	var stamp string
	for _, f := range []string{s.certFile, s.keyFile, s.caFile} {
		if f == "" {
			continue
		}
		fi, err := os.Stat(f)
		if err != nil {
			return "", fmt.Errorf("tls: %w", err)
		}
		stamp += fmt.Sprintf("%s:%d:%d;", f, fi.ModTime().UnixNano(), fi.Size())
	}
	return stamp, nil
}

func (s *Server) load() (*tls.Config, error) {
	cert, err := tls.LoadX509KeyPair(s.certFile, s.keyFile)
	if err != nil {
		return nil, fmt.Errorf("tls: load %s and %s: %w", s.certFile, s.keyFile, err)
	}
	cfg := &tls.Config{
		MinVersion:   tls.VersionTLS12,
		Certificates: []tls.Certificate{cert},
		NextProtos:   []string{"h2"},
	}
	if s.caFile != "" {
		pool, err := loadPool(s.caFile)
		if err != nil {
			return nil, err
		}
		cfg.ClientCAs = pool
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return cfg, nil
}

func loadPool(caFile string) (*x509.CertPool, error) {
	b, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("tls: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("tls: %s holds no PEM certificate", caFile)
	}
	return pool, nil
}

// Client returns a client tls.Config (for etcd): caFile, if set, replaces
// the system roots; certFile and keyFile, if set, are the client
// certificate. It returns nil when all three are empty (plaintext).
func Client(caFile, certFile, keyFile string) (*tls.Config, error) {
	if caFile == "" && certFile == "" && keyFile == "" {
		return nil, nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if caFile != "" {
		pool, err := loadPool(caFile)
		if err != nil {
			return nil, err
		}
		cfg.RootCAs = pool
	}
	if (certFile == "") != (keyFile == "") {
		return nil, errors.New("tls: a client certificate needs both its certificate and key files")
	}
	if certFile != "" {
		cert, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, fmt.Errorf("tls: load %s and %s: %w", certFile, keyFile, err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}
