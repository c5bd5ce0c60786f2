package daemon

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"time"

	"github.com/coordinatord/coordinatord/internal/embedetcd"
	"github.com/coordinatord/coordinatord/internal/lease"
	"github.com/coordinatord/coordinatord/internal/server"
)

// Config is everything a Daemon needs. The zero value of a field means what
// its comment says (often: off, or a default); Validate refuses the values
// no source may give, and names the flag of the field in its error, since
// flags and their COORDINATORD_* environment variables are where a Config
// usually comes from.
type Config struct {
	// Listen is the gRPC listen address, e.g. "127.0.0.1:7070".
	Listen string
	// EtcdEndpoints are the etcd client URLs; empty starts an embedded
	// single-member etcd in DataDir.
	EtcdEndpoints []string
	// EtcdCA, EtcdCert and EtcdKey (PEM files) secure the connection to
	// etcd: the CA that signed etcd's server certificate, and the client
	// certificate etcd requires with --client-cert-auth.
	EtcdCA, EtcdCert, EtcdKey string
	// EtcdUsername and EtcdPassword authenticate to etcd (etcd auth/RBAC).
	EtcdUsername, EtcdPassword string
	// KeyPrefix is the etcd key prefix of every key written.
	KeyPrefix string
	// DataDir holds the embedded etcd's data.
	DataDir string
	// Embedded etcd only (ignored with EtcdEndpoints): its auto-compaction
	// (etcd's --auto-compaction-mode and -retention; empty: periodic, 5m;
	// retention "0": off), its quota (--quota-backend-bytes; 0: 2 GiB), and
	// how often its space keeper looks (0: 5s), see internal/embedetcd.
	EtcdAutoCompactionMode, EtcdAutoCompactionRetention string
	EtcdQuotaBackendBytes                               int64
	EtcdSpaceCheck                                      time.Duration
	// ReadinessInterval is how often etcd is probed for /readyz and the gRPC
	// health status (0: 2s).
	ReadinessInterval time.Duration
	// DefaultTTL and MaxTTL bound lease TTLs.
	DefaultTTL, MaxTTL time.Duration
	// MaxHold caps how long a grant may be renewed (positive; see
	// WithDefaults).
	MaxHold time.Duration
	// MaxLockDelay caps the lock-delay an acquisition may ask for; zero
	// allows none.
	MaxLockDelay time.Duration
	// ShutdownTimeout bounds the graceful stop; then in-flight calls are
	// cut (positive; see WithDefaults).
	ShutdownTimeout time.Duration
	// Logger receives the structured logs.
	Logger *slog.Logger
	// OnListen, if set, is called with the bound address once serving.
	OnListen func(net.Addr)

	// TLSCert and TLSKey (PEM files) switch gRPC to TLS; with TLSClientCA
	// every client must present a certificate that chains to it (mutual
	// TLS). The files are re-read when they change.
	TLSCert, TLSKey, TLSClientCA string
	// TLSIdentityFromCN identifies a client certificate without URI or DNS
	// SANs by its subject CN (see authz.IdentityFromCert); off, such a
	// certificate names no identity.
	TLSIdentityFromCN bool

	// AuthPolicy, if set, is the authorization policy file (JSON, see
	// authz.Policy): every call but health and reflection then needs an
	// identity, from a verified client certificate or a bearer token listed
	// in AuthTokens. Both files are reloaded when they change (checked every
	// AuthReloadInterval, positive; see WithDefaults) and on SIGHUP.
	AuthPolicy, AuthTokens string
	AuthReloadInterval     time.Duration

	// MetricsListen, if set, is the HTTP address of /metrics, /healthz and
	// /readyz, e.g. "127.0.0.1:9090".
	MetricsListen string
	// OnMetricsListen, if set, is called with the metrics listener's address.
	OnMetricsListen func(net.Addr)
	// HealthListen, if set, is a second, plaintext gRPC address that serves
	// only grpc.health.v1.Health (same statuses) and reflection: for
	// Kubernetes gRPC probes, which cannot speak TLS.
	HealthListen string
	// OnHealthListen, if set, is called with the health listener's address.
	OnHealthListen func(net.Addr)

	// Limits; 0 disables each.
	MaxRecvMsgSize       int           // largest request message, bytes (gRPC's own default, 4 MiB, if 0)
	MaxConcurrentStreams uint32        // concurrent calls per client connection
	KeepaliveMinTime     time.Duration // clients pinging more often get GOAWAY (gRPC's default, 5m, if 0)
	RateLimit            float64       // requests per second per caller (identity, else IP)
	RateBurst            int           // burst of RateLimit
	MaxWaitersPerLock    int64         // waiters per lock
	// Core is the lock core: "queue" (the default: every queue kept in
	// etcd) or "shard" (the shard-owner core, being built: locks decided in
	// memory by one owner per shard, persisted by one guarded group commit).
	Core string
	// ShardLeaseTTL is the member lease of the shard core: a crashed
	// owner's shards serve again about this long after its last renewal.
	ShardLeaseTTL time.Duration
	// Role is the replica's part in the shard core: "member" (the default:
	// it owns shards and forwards the calls on the others' shards) or
	// "relay" (it owns nothing and forwards every call, as a sidecar).
	Role string
	// Advertise is the host:port the other replicas of the shard core
	// forward this member's shards' calls to; empty: the gRPC listener's
	// address as bound (set it to the pod IP in Kubernetes: a wildcard or
	// loopback listener is not reachable by the peers).
	Advertise string
	// PeerServerName, with TLS on the shard core, is the name a peer's
	// certificate is checked against when this replica forwards to it
	// (empty: the host of its advertised address, usually a pod IP, which
	// the certificate must then carry as an IP SAN).
	PeerServerName string
	// MemberSecretFile holds the secret the replicas of the shard core
	// share (whitespace around it ignored; printable ASCII, at least 16
	// bytes): a replica forwards its caller's identity with it, and accepts
	// a forwarded identity only with it. Needed with AuthPolicy and more
	// than one replica.
	MemberSecretFile    string
	MaxLocksPerIdentity int64         // locks held or awaited per authenticated identity (needs AuthPolicy)
	MaxWait             time.Duration // queue wait of an Acquire
	MaxWatchStreams     int           // concurrent Watch streams per caller (identity, else IP)
	MaxHoldStreams      int           // concurrent Hold streams per caller (identity, else IP)
	MaxConnections      int           // open client connections on the gRPC listener
	MaxConnectionIdle   time.Duration // a connection without calls this long is sent GOAWAY
	MaxMarksPerIdentity int64         // resource marks one identity may create (unauthenticated callers: one identity)
	MarkRetention       time.Duration // a mark whose lock stayed free this long is deleted (see fence.SweepMarks)
	CounterFailOpen     bool          // counter hits that name no policy are allowed, uncounted, while etcd is unavailable
	CounterStoreTimeout time.Duration // how long a counter hit waits for etcd before it counts as unavailable
}

// Defaults of the fields that WithDefaults fills (and of their flags).
const (
	DefaultMaxHold             = lease.MaxHold
	DefaultShutdownTimeout     = 10 * time.Second
	DefaultAuthReloadInterval  = 5 * time.Second
	DefaultCounterStoreTimeout = 2 * time.Second
)

// WithDefaults returns cfg with its unset (zero) MaxHold, ShutdownTimeout
// and AuthReloadInterval set to their defaults, for callers that build a
// Config by hand (Run applies it; the flags have these defaults already, so
// that a zero given on the command line is refused by Validate, not
// replaced).
func (cfg Config) WithDefaults() Config {
	if cfg.MaxHold == 0 {
		cfg.MaxHold = DefaultMaxHold
	}
	if cfg.ShutdownTimeout == 0 {
		cfg.ShutdownTimeout = DefaultShutdownTimeout
	}
	if cfg.AuthReloadInterval == 0 {
		cfg.AuthReloadInterval = DefaultAuthReloadInterval
	}
	if cfg.CounterStoreTimeout == 0 {
		cfg.CounterStoreTimeout = DefaultCounterStoreTimeout
	}
	return cfg
}

// Validate tells whether cfg can run, before anything starts: it is the one
// place a configuration is checked (flags and environment variables arrive
// here as fields; New calls it again for callers that did not). An error
// names the flag of the offending field and says what it must be.
func (cfg Config) Validate() error {
	mode, retention := cfg.compaction()
	switch {
	case cfg.MaxTTL < time.Second:
		return fmt.Errorf("-max-ttl %v: must be at least 1s", cfg.MaxTTL)
	case cfg.DefaultTTL < time.Second || cfg.DefaultTTL > cfg.MaxTTL:
		return fmt.Errorf("-default-ttl %v: must be between 1s and -max-ttl (%v)", cfg.DefaultTTL, cfg.MaxTTL)
	case (cfg.TLSCert == "") != (cfg.TLSKey == ""):
		return errors.New("-tls-cert and -tls-key go together")
	case cfg.TLSClientCA != "" && cfg.TLSCert == "":
		return errors.New("-tls-client-ca needs -tls-cert and -tls-key")
	case cfg.TLSIdentityFromCN && cfg.TLSClientCA == "":
		return errors.New("-tls-identity-from-cn needs -tls-client-ca: without mutual TLS there are no client certificates")
	case cfg.AuthTokens != "" && cfg.AuthPolicy == "":
		return errors.New("-auth-tokens needs -auth-policy: tokens name identities, the policy says what they may do")
	case (cfg.EtcdUsername == "") != (cfg.EtcdPassword == ""):
		return errors.New("-etcd-username and -etcd-password-file go together")
	case cfg.MaxRecvMsgSize < 0 || cfg.RateLimit < 0 || cfg.RateBurst < 0 || cfg.MaxWaitersPerLock < 0 || cfg.MaxLocksPerIdentity < 0 || cfg.MaxWait < 0 || cfg.KeepaliveMinTime < 0:
		return errors.New("-max-recv-msg-size, -rate-limit, -rate-burst, -max-waiters-per-lock, -max-locks-per-identity, -max-wait and -keepalive-min-time must not be negative")
	case cfg.MaxWatchStreams < 0 || cfg.MaxHoldStreams < 0 || cfg.MaxConnections < 0 || cfg.MaxConnectionIdle < 0:
		return errors.New("-max-watch-streams-per-caller, -max-hold-streams-per-caller, -max-connections and -max-connection-idle must not be negative")
	case cfg.MaxMarksPerIdentity < 0 || cfg.MarkRetention < 0:
		return errors.New("-max-marks-per-identity and -mark-retention must not be negative")
	case cfg.AuthReloadInterval <= 0:
		return fmt.Errorf("-auth-reload-interval %v: must be positive", cfg.AuthReloadInterval)
	case cfg.EtcdQuotaBackendBytes < 0:
		return fmt.Errorf("-etcd-quota-backend-bytes %d: must not be negative", cfg.EtcdQuotaBackendBytes)
	case embedetcd.ValidateCompaction(mode, retention) != nil:
		return fmt.Errorf("-etcd-auto-compaction-mode/-retention: %w", embedetcd.ValidateCompaction(mode, retention))
	case cfg.Core != "" && cfg.Core != CoreQueue && cfg.Core != CoreShard:
		return fmt.Errorf("-core %q: must be %q or %q", cfg.Core, CoreQueue, CoreShard)
	case cfg.ShardLeaseTTL < 0 || (cfg.ShardLeaseTTL > 0 && cfg.ShardLeaseTTL < time.Second):
		return fmt.Errorf("-shard-lease-ttl %v: must be at least 1s (etcd leases are whole seconds)", cfg.ShardLeaseTTL)
	case cfg.Role != "" && cfg.Role != RoleMember && cfg.Role != RoleRelay:
		return fmt.Errorf("-role %q: must be %q or %q", cfg.Role, RoleMember, RoleRelay)
	case cfg.Role == RoleRelay && cfg.Core != CoreShard:
		return fmt.Errorf("-role relay needs -core shard: a relay forwards calls to the owners of the shard core's shards; the queue core has none")
	case cfg.Advertise != "" && cfg.Core != CoreShard:
		return errors.New("-advertise needs -core shard: only the shard core forwards calls between replicas")
	case cfg.PeerServerName != "" && (cfg.Core != CoreShard || cfg.TLSCert == ""):
		return errors.New("-peer-server-name needs -core shard and -tls-cert: it names the peers' certificates when members forward over TLS")
	case cfg.Advertise != "" && validHostPort(cfg.Advertise) != nil:
		return fmt.Errorf("-advertise %q: %w", cfg.Advertise, validHostPort(cfg.Advertise))
	case cfg.MemberSecretFile != "" && cfg.Core != CoreShard:
		return errors.New("-member-secret-file needs -core shard: only the shard core forwards calls between replicas")
	case cfg.Role == RoleRelay && cfg.AuthPolicy != "" && cfg.MemberSecretFile == "":
		return errors.New("-role relay with -auth-policy needs -member-secret-file: a relay forwards every call, and the members accept its callers' identities only with the member secret")
	case cfg.MaxHold <= 0:
		return fmt.Errorf("-max-hold %v: must be positive", cfg.MaxHold)
	case cfg.MaxLockDelay < 0:
		return fmt.Errorf("-max-lock-delay %v: must not be negative", cfg.MaxLockDelay)
	case cfg.ShutdownTimeout <= 0:
		return fmt.Errorf("-shutdown-timeout %v: must be positive", cfg.ShutdownTimeout)
	case cfg.CounterStoreTimeout < 0:
		return fmt.Errorf("-counter-store-timeout %v: must not be negative (0: the default, %v)", cfg.CounterStoreTimeout, DefaultCounterStoreTimeout)
	}
	if _, err := cfg.memberSecret(); err != nil {
		return err
	}
	return nil
}

// memberSecret is the secret of MemberSecretFile, nil without one. A
// secret that is empty, shorter than server.MinMemberSecret bytes or not
// printable ASCII (it travels as gRPC metadata) is refused.
func (cfg Config) memberSecret() ([]byte, error) {
	if cfg.MemberSecretFile == "" {
		return nil, nil
	}
	b, err := os.ReadFile(cfg.MemberSecretFile)
	if err != nil {
		return nil, fmt.Errorf("-member-secret-file: %w", err)
	}
	secret := bytes.TrimSpace(b)
	switch {
	case len(secret) == 0:
		return nil, fmt.Errorf("-member-secret-file %s: the file is empty; write a random secret of at least %d bytes into it (e.g. openssl rand -hex 32)", cfg.MemberSecretFile, server.MinMemberSecret)
	case len(secret) < server.MinMemberSecret:
		return nil, fmt.Errorf("-member-secret-file %s: the secret is %d bytes long, shorter than %d; write a random secret of at least %d bytes into it (e.g. openssl rand -hex 32)",
			cfg.MemberSecretFile, len(secret), server.MinMemberSecret, server.MinMemberSecret)
	case bytes.ContainsFunc(secret, func(r rune) bool { return r < 0x21 || r > 0x7e }):
		return nil, fmt.Errorf("-member-secret-file %s: the secret must be printable ASCII without spaces (it travels as gRPC metadata), e.g. openssl rand -hex 32", cfg.MemberSecretFile)
	}
	return secret, nil
}

// validHostPort checks an address peers can dial: host:port, both set.
func validHostPort(addr string) error {
	host, port, err := net.SplitHostPort(addr)
	switch {
	case err != nil:
		return fmt.Errorf("want host:port: %w", err)
	case host == "" || port == "":
		return errors.New("want host:port with both set, e.g. 10.0.3.7:7070")
	}
	return nil
}

// compaction is the embedded etcd's auto-compaction, defaults filled in.
func (cfg Config) compaction() (mode, retention string) {
	mode, retention = cfg.EtcdAutoCompactionMode, cfg.EtcdAutoCompactionRetention
	if mode == "" {
		mode = embedetcd.DefaultCompactionMode
	}
	if retention == "" {
		retention = embedetcd.DefaultRetention
	}
	return mode, retention
}

// readinessInterval is ReadinessInterval, default filled in.
func (cfg Config) readinessInterval() time.Duration {
	if cfg.ReadinessInterval <= 0 {
		return 2 * time.Second
	}
	return cfg.ReadinessInterval
}

// logger is Logger, or a logger that discards.
func (cfg Config) logger() *slog.Logger {
	if cfg.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return cfg.Logger
}

// The lock cores of -core.
const (
	CoreQueue = "queue"
	CoreShard = "shard"
)

// The roles of -role (the shard core).
const (
	RoleMember = "member"
	RoleRelay  = "relay"
)
