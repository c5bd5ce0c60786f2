package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

const connectionHelp = `
Connection flags (any command; each also from its environment variable, a flag wins):
  --addr HOST:PORT     coordinator address ($COORDCTL_ADDR, default 127.0.0.1:7070)
  --tls                use TLS with the system's CA roots ($COORDCTL_TLS=1); implied by the
                       three flags below
  --tls-ca FILE        PEM CA bundle to verify the server with ($COORDCTL_TLS_CA)
  --tls-cert FILE      PEM client certificate, for mutual TLS ($COORDCTL_TLS_CERT)
  --tls-key FILE       its PEM key ($COORDCTL_TLS_KEY)
  --tls-server-name S  name to verify the server certificate against ($COORDCTL_TLS_SERVER_NAME;
                       default: the host of --addr)
  --token-file FILE    bearer token, sent as "authorization: Bearer <token>" ($COORDCTL_TOKEN_FILE;
                       surrounding whitespace ignored). Use it over TLS or on loopback only.
  --timeout D          bound on each call, retries of UNAVAILABLE included, not counting the
                       time acquire and exec wait in the queue ($COORDCTL_TIMEOUT, default 10s)
`

// connFlags are the connection flags every command shares.
type connFlags struct {
	addr          string
	tls           bool
	tlsCA         string
	tlsCert       string
	tlsKey        string
	tlsServerName string
	tokenFile     string
	timeout       time.Duration
}

// envOr returns $COORDCTL_<name> or def.
func envOr(name, def string) string {
	if v, ok := os.LookupEnv("COORDCTL_" + name); ok {
		return v
	}
	return def
}

// newConnFlags returns the connection settings from the environment;
// warnings about bad values go to w.
func newConnFlags(w io.Writer) *connFlags {
	c := &connFlags{
		addr:          envOr("ADDR", "127.0.0.1:7070"),
		tlsCA:         envOr("TLS_CA", ""),
		tlsCert:       envOr("TLS_CERT", ""),
		tlsKey:        envOr("TLS_KEY", ""),
		tlsServerName: envOr("TLS_SERVER_NAME", ""),
		tokenFile:     envOr("TOKEN_FILE", ""),
		timeout:       10 * time.Second,
	}
	if v := envOr("TIMEOUT", ""); v != "" {
		if d, err := parseDuration(v); err == nil {
			c.timeout = d
		} else {
			fmt.Fprintf(w, "coordctl: COORDCTL_TIMEOUT: %v; using %v\n", err, c.timeout)
		}
	}
	switch strings.ToLower(envOr("TLS", "")) {
	case "1", "true", "yes":
		c.tls = true
	}
	return c
}

// register adds the connection flags to fs, with the current values as
// defaults (so flags given before the command stay in force).
func (c *connFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&c.addr, "addr", c.addr, "coordinator address ($COORDCTL_ADDR)")
	fs.BoolVar(&c.tls, "tls", c.tls, "use TLS with the system's CA roots ($COORDCTL_TLS)")
	fs.StringVar(&c.tlsCA, "tls-ca", c.tlsCA, "PEM CA bundle of the server certificate ($COORDCTL_TLS_CA)")
	fs.StringVar(&c.tlsCert, "tls-cert", c.tlsCert, "PEM client certificate for mutual TLS ($COORDCTL_TLS_CERT)")
	fs.StringVar(&c.tlsKey, "tls-key", c.tlsKey, "PEM key of --tls-cert ($COORDCTL_TLS_KEY)")
	fs.StringVar(&c.tlsServerName, "tls-server-name", c.tlsServerName, "server name to verify ($COORDCTL_TLS_SERVER_NAME)")
	fs.StringVar(&c.tokenFile, "token-file", c.tokenFile, "file holding a bearer token ($COORDCTL_TOKEN_FILE)")
	durationVar(fs, &c.timeout, "timeout", c.timeout, "the `duration` that bounds each call, retries included, queue wait excluded ($COORDCTL_TIMEOUT)")
}

// bearer sends a bearer token with every call.
type bearer string

func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(b)}, nil
}

// RequireTransportSecurity is false: a sidecar on loopback is served in
// plaintext, and the help says to use tokens only over TLS or loopback.
func (bearer) RequireTransportSecurity() bool { return false }

// usageError is a bad flag value found while connecting.
type usageError struct{ error }

// dial opens a (lazy) connection to the coordinator.
func (c *connFlags) dial() (*grpc.ClientConn, error) {
	if c.timeout <= 0 {
		return nil, usageError{fmt.Errorf("--timeout %v: want a positive duration", c.timeout)}
	}
	if (c.tlsCert == "") != (c.tlsKey == "") {
		return nil, usageError{errors.New("--tls-cert and --tls-key go together")}
	}
	creds := insecure.NewCredentials()
	if c.tls || c.tlsCA != "" || c.tlsCert != "" || c.tlsServerName != "" {
		cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: c.tlsServerName}
		if c.tlsCA != "" {
			pem, err := os.ReadFile(c.tlsCA)
			if err != nil {
				return nil, usageError{fmt.Errorf("--tls-ca: %w", err)}
			}
			cfg.RootCAs = x509.NewCertPool()
			if !cfg.RootCAs.AppendCertsFromPEM(pem) {
				return nil, usageError{fmt.Errorf("--tls-ca %s: no PEM certificate in it", c.tlsCA)}
			}
		}
		if c.tlsCert != "" {
			cert, err := tls.LoadX509KeyPair(c.tlsCert, c.tlsKey)
			if err != nil {
				return nil, usageError{fmt.Errorf("--tls-cert/--tls-key: %w", err)}
			}
			cfg.Certificates = []tls.Certificate{cert}
		}
		creds = credentials.NewTLS(cfg)
	}
	opts := []grpc.DialOption{grpc.WithTransportCredentials(creds)}
	if c.tokenFile != "" {
		b, err := os.ReadFile(c.tokenFile)
		if err != nil {
			return nil, usageError{fmt.Errorf("--token-file: %w", err)}
		}
		tok := strings.TrimSpace(string(b))
		if tok == "" {
			return nil, usageError{fmt.Errorf("--token-file %s is empty", c.tokenFile)}
		}
		opts = append(opts, grpc.WithPerRPCCredentials(bearer(tok)))
	}
	conn, err := grpc.NewClient(c.addr, opts...)
	if err != nil {
		return nil, usageError{fmt.Errorf("--addr %q: %w", c.addr, err)}
	}
	return conn, nil
}

// connect dials, printing the error and returning its exit code on failure.
func (e *env) connect() (*grpc.ClientConn, int) {
	conn, err := e.conn.dial()
	if err != nil {
		fmt.Fprintf(e.stderr, "%s: %v\n", e.name, err)
		return nil, exitUsage
	}
	return conn, -1
}

// waitReady waits up to --timeout for the connection to be up: an acquire
// or exec without --wait has no deadline of its own, and must not retry a
// coordinator that is down forever.
func (e *env) waitReady(ctx context.Context, conn *grpc.ClientConn) error {
	ctx, cancel := context.WithTimeout(ctx, e.conn.timeout)
	defer cancel()
	conn.Connect()
	for {
		s := conn.GetState()
		if s == connectivity.Ready {
			return nil
		}
		if !conn.WaitForStateChange(ctx, s) {
			return status.Errorf(codes.Unavailable, "no connection to the coordinator at %s within --timeout %v (last state %v)", e.conn.addr, e.conn.timeout, s)
		}
	}
}
