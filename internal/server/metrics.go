package server

import (
	"context"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
	"github.com/coordinatord/coordinatord/internal/lease"
	"github.com/coordinatord/coordinatord/internal/version"
)

// Metrics are the Prometheus metrics of one coordinator: per-RPC counters
// and latency histograms (go-grpc-middleware's grpc_server_*, see
// rpcMetrics), and lock
// metrics read from the requests and answers of the LockService:
//
//	coordinatord_acquisitions_total{outcome}       Acquire calls by outcome: granted, not_granted (ABORTED), or the gRPC code in snake case
//	coordinatord_acquire_wait_seconds{outcome}     how long Acquire calls took (queue wait included), by the same outcome
//	coordinatord_grants_total{kind}                Acquire calls granted, by what was asked: mutex, semaphore (limit > 1), reader, writer (a mode set)
//	coordinatord_validations_total{outcome}        ValidateToken answers: current, superseded, not_held, fenced, or the gRPC code of an error
//	coordinatord_releases_total{outcome}           Release calls: released, not_released, or the gRPC code of an error
//	coordinatord_renewals_total{outcome}           KeepAlive calls: renewed, or the gRPC code (not_found: the grant is gone)
//	coordinatord_locks_held, coordinatord_lock_waiters   read from etcd at scrape time (see CountLocks)
//	coordinatord_hold_seconds{outcome}             how long grants were held, by how they ended: released, forced or expired (see GrantEnded)
//	coordinatord_expirations_total                 grants that expired while held: their lease ran out (see GrantEnded)
//	coordinatord_counter_hits_total{outcome}       CounterService.Hit calls: allowed, refused, uncounted (FAIL_OPEN), replayed (request_id), or the gRPC code (never the counter's name)
//	coordinatord_build_info{version,revision,goversion}   always 1: the build serving (internal/version)
type Metrics struct {
	rpc          *rpcMetrics
	acquisitions *prometheus.CounterVec
	grants       *prometheus.CounterVec
	waitSeconds  *prometheus.HistogramVec
	validations  *prometheus.CounterVec
	releases     *prometheus.CounterVec
	renewals     *prometheus.CounterVec
	holdSeconds  *prometheus.HistogramVec
	expirations  prometheus.Counter
	counterHits  *prometheus.CounterVec
	reg          prometheus.Registerer

	// The series the interceptor feeds, by outcome label, looked up once.
	acquisitionsBy, grantsBy, validationsBy, releasesBy, renewalsBy, counterHitsBy series[prometheus.Counter]
	waitSecondsBy                                                                  series[prometheus.Observer]
}

// series caches the series of a one-label vector by label value:
// WithLabelValues hashes the value and takes the vector's lock on every
// call. The label values are outcomes (a few, and gRPC codes), never names.
type series[T any] struct {
	with func(...string) T
	m    sync.Map // label value -> T
}

func (s *series[T]) get(v string) T {
	if c, ok := s.m.Load(v); ok {
		return c.(T)
	}
	c := s.with(v)
	s.m.Store(v, c)
	return c
}

// NewMetrics creates the metrics and registers them with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	outcome := []string{"outcome"}
	m := &Metrics{
		rpc: newRPCMetrics([]float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300}),
		acquisitions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "coordinatord_acquisitions_total", Help: "Acquire calls by outcome: granted, not_granted (ABORTED: the wait elapsed), or the gRPC code of the failure.",
		}, outcome),
		grants: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "coordinatord_grants_total", Help: "Acquire calls granted, by kind: mutex, semaphore (limit > 1), reader or writer (a read-write lock's mode).",
		}, []string{"kind"}),
		waitSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "coordinatord_acquire_wait_seconds",
			Help:    "Duration of Acquire calls, queue wait included, by outcome.",
			Buckets: []float64{.001, .005, .01, .05, .1, .5, 1, 5, 10, 30, 60, 300, 900},
		}, outcome),
		validations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "coordinatord_validations_total", Help: "ValidateToken answers by outcome: current, superseded, not_held, fenced, or the gRPC code of an error.",
		}, outcome),
		releases: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "coordinatord_releases_total", Help: "Release calls by outcome: released, not_released, or the gRPC code of an error.",
		}, outcome),
		renewals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "coordinatord_renewals_total", Help: "KeepAlive calls by outcome: renewed, or the gRPC code of the failure (not_found: the grant is gone).",
		}, outcome),
		holdSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "coordinatord_hold_seconds",
			Help: "How long grants were held, from grant to end, by how they ended: released, forced (ForceRelease) or expired " +
				"(queue core: every lock under the key prefix, whichever replica granted it, so aggregate replicas with max(); " +
				"shard core: the ends this member's shards committed, so aggregate with sum()).",
			Buckets: []float64{.01, .05, .1, .5, 1, 5, 10, 30, 60, 300, 900, 1800, 3600},
		}, outcome),
		expirations: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "coordinatord_expirations_total",
			Help: "Grants that expired while held: the lease ran out (or was revoked) without a release " +
				"(queue core: every lock under the key prefix, so aggregate replicas with max(); shard core: this member's shards, so sum()).",
		}),
		counterHits: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "coordinatord_counter_hits_total",
			Help: "CounterService.Hit calls by outcome: allowed, refused, uncounted (FAIL_OPEN while etcd was unavailable), replayed (a request_id's recorded answer), or the gRPC code of an error.",
		}, outcome),
		reg: reg,
	}
	m.acquisitionsBy.with, m.grantsBy.with, m.validationsBy.with = m.acquisitions.WithLabelValues, m.grants.WithLabelValues, m.validations.WithLabelValues
	m.releasesBy.with, m.renewalsBy.with, m.counterHitsBy.with = m.releases.WithLabelValues, m.renewals.WithLabelValues, m.counterHits.WithLabelValues
	m.waitSecondsBy.with = m.waitSeconds.WithLabelValues
	reg.MustRegister(m.rpc, m.acquisitions, m.grants, m.waitSeconds, m.validations, m.releases, m.renewals, m.holdSeconds, m.expirations, m.counterHits, buildInfo())
	// The usual outcomes start at zero, so that rate() sees their first event.
	for _, o := range []string{"granted", "not_granted"} {
		m.acquisitions.WithLabelValues(o)
		m.waitSeconds.WithLabelValues(o)
	}
	for _, o := range []string{"current", "superseded", "not_held", "fenced"} {
		m.validations.WithLabelValues(o)
	}
	for _, k := range []string{"mutex", "semaphore", "reader", "writer"} {
		m.grants.WithLabelValues(k)
	}
	m.releases.WithLabelValues("released")
	m.releases.WithLabelValues("not_released")
	m.renewals.WithLabelValues("renewed")
	m.renewals.WithLabelValues("not_found")
	for _, o := range []string{"allowed", "refused", "uncounted", "replayed"} {
		m.counterHits.WithLabelValues(o)
	}
	for _, o := range []string{"released", "forced", "expired"} {
		m.holdSeconds.WithLabelValues(o)
	}
	return m
}

// buildInfo is coordinatord_build_info, 1 with the build's version,
// revision and Go toolchain as labels: join on it to see which replica runs
// which build (count by (version) (coordinatord_build_info) during a
// rollout).
func buildInfo() prometheus.Gauge {
	v := version.Get()
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "coordinatord_build_info",
		Help:        "Always 1; the labels name the build serving: version (release, VCS revision or dev), revision (VCS commit or unknown) and goversion.",
		ConstLabels: prometheus.Labels{"version": v.Version, "revision": v.Revision, "goversion": v.GoVersion},
	})
	g.Set(1)
	return g
}

// GrantEnded records a grant's end in coordinatord_hold_seconds and, if it
// expired, coordinatord_expirations_total. Feed it from
// lease.Manager.WatchEnds: expiries happen inside etcd, where no RPC sees
// them. Each replica sees every grant under the key prefix.
func (m *Metrics) GrantEnded(e lease.GrantEnd) {
	o := "expired"
	switch e.Reason {
	case lease.EndReleased:
		o = "released"
	case lease.EndForced:
		o = "forced"
	default:
		m.expirations.Inc()
	}
	m.holdSeconds.WithLabelValues(o).Observe(e.Held.Seconds())
}

// Option returns the server option that installs the metrics interceptors
// (outermost, before logging).
func (m *Metrics) Option() Option {
	return WithOuterInterceptors(
		[]grpc.UnaryServerInterceptor{m.rpc.unary, m.lockInterceptor},
		[]grpc.StreamServerInterceptor{m.rpc.stream})
}

// Initialize pre-creates the per-RPC series of every method of gs at zero.
func (m *Metrics) Initialize(gs *grpc.Server) { m.rpc.initialize(gs) }

// CountLocks adds the gauges coordinatord_locks_held and
// coordinatord_lock_waiters, computed by count at every scrape (bounded by
// timeout). On the queue core they count every lock under the key prefix,
// whichever replica granted it (aggregate replicas with max()); on the
// shard core, the locks of the member's shards (aggregate with sum()). A
// failed count leaves the gauges out of that scrape.
func (m *Metrics) CountLocks(timeout time.Duration, count func(context.Context) (held, waiting int64, err error)) {
	m.reg.MustRegister(&lockCensus{count: count, timeout: timeout})
}

var (
	heldDesc    = prometheus.NewDesc("coordinatord_locks_held", "Locks that have a holder (all replicas sharing the key prefix).", nil, nil)
	waitersDesc = prometheus.NewDesc("coordinatord_lock_waiters", "Contenders waiting in lock queues (all replicas sharing the key prefix).", nil, nil)
)

type lockCensus struct {
	count   func(context.Context) (int64, int64, error)
	timeout time.Duration
}

func (c *lockCensus) Describe(ch chan<- *prometheus.Desc) { ch <- heldDesc; ch <- waitersDesc }

func (c *lockCensus) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	held, waiting, err := c.count(ctx)
	if err != nil {
		return
	}
	ch <- prometheus.MustNewConstMetric(heldDesc, prometheus.GaugeValue, float64(held))
	ch <- prometheus.MustNewConstMetric(waitersDesc, prometheus.GaugeValue, float64(waiting))
}

// codeLabel is a gRPC code in snake case ("not_found").
func codeLabel(c codes.Code) string {
	if int(c) < len(codeLabels) {
		return codeLabels[c]
	}
	return snakeCase(c.String())
}

// codeLabels are the labels of the codes gRPC defines, computed once.
var codeLabels = func() (l [codes.Unauthenticated + 1]string) {
	for c := range codes.Unauthenticated + 1 {
		l[c] = snakeCase(c.String())
	}
	return l
}()

func snakeCase(s string) string {
	var b strings.Builder
	for i, r := range s {
		if r >= 'A' && r <= 'Z' {
			if i > 0 {
				b.WriteByte('_')
			}
			r += 'a' - 'A'
		}
		b.WriteRune(r)
	}
	return b.String()
}

// reasonLabels are the outcome labels of the ValidateToken reasons
// ("superseded" for REASON_SUPERSEDED), computed once.
var reasonLabels = func() map[coordinatorv1.ValidateTokenResponse_Reason]string {
	l := map[coordinatorv1.ValidateTokenResponse_Reason]string{}
	for v := range coordinatorv1.ValidateTokenResponse_Reason_name {
		r := coordinatorv1.ValidateTokenResponse_Reason(v)
		l[r] = reasonLabel(r)
	}
	return l
}()

func reasonLabel(r coordinatorv1.ValidateTokenResponse_Reason) string {
	return strings.ToLower(strings.TrimPrefix(r.String(), "REASON_"))
}

func (m *Metrics) lockInterceptor(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	var start time.Time
	if info.FullMethod == coordinatorv1.LockService_Acquire_FullMethodName {
		start = time.Now()
	}
	resp, err := h(ctx, req)
	switch info.FullMethod {
	case coordinatorv1.LockService_Acquire_FullMethodName:
		c := status.Code(err)
		o := codeLabel(c)
		switch c {
		case codes.OK:
			o = "granted"
		case codes.Aborted:
			o = "not_granted"
		}
		m.acquisitionsBy.get(o).Inc()
		if c == codes.OK {
			m.grantsBy.get(grantKind(req)).Inc()
		}
		m.waitSecondsBy.get(o).Observe(time.Since(start).Seconds())
	case coordinatorv1.LockService_ValidateToken_FullMethodName:
		var o string
		if r, ok := resp.(*coordinatorv1.ValidateTokenResponse); ok && err == nil {
			if o, ok = reasonLabels[r.GetReason()]; !ok {
				o = reasonLabel(r.GetReason())
			}
		} else {
			o = codeLabel(status.Code(err))
		}
		m.validationsBy.get(o).Inc()
	case coordinatorv1.LockService_Release_FullMethodName:
		o := codeLabel(status.Code(err))
		if r, ok := resp.(*coordinatorv1.ReleaseResponse); ok && err == nil {
			o = "not_released"
			if r.GetReleased() {
				o = "released"
			}
		}
		m.releasesBy.get(o).Inc()
	case coordinatorv1.LockService_KeepAlive_FullMethodName:
		o := codeLabel(status.Code(err))
		if err == nil {
			o = "renewed"
		}
		m.renewalsBy.get(o).Inc()
	case coordinatorv1.CounterService_Hit_FullMethodName:
		m.counterHitsBy.get(hitOutcome(resp, err)).Inc()
	}
	return resp, err
}

// grantKind is the kind label of a granted Acquire: what its request asked.
func grantKind(req any) string {
	r, _ := req.(*coordinatorv1.AcquireRequest)
	switch {
	case r.GetLimit() > 1:
		return "semaphore"
	case r.GetMode() == coordinatorv1.LockMode_LOCK_MODE_SHARED:
		return "reader"
	case r.GetMode() == coordinatorv1.LockMode_LOCK_MODE_EXCLUSIVE:
		return "writer"
	}
	return "mutex"
}

// hitOutcome is the outcome label of a Hit call.
func hitOutcome(resp any, err error) string {
	r, ok := resp.(*coordinatorv1.HitResponse)
	switch {
	case err != nil || !ok:
		return codeLabel(status.Code(err))
	case r.GetUncounted():
		return "uncounted"
	case r.GetReplayed():
		return "replayed"
	case r.GetAllowed():
		return "allowed"
	}
	return "refused"
}
