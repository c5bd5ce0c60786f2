package chaos

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/grpc"

	"github.com/coordinatord/coordinatord/internal/shard"
)

// The chaos harness on the shard-owner core (coordinator.WithShardCore):
// replicas that are members of the core (each owns some of the shards and
// forwards the calls on the others' shards to their owners) or relays
// (they own nothing and forward every call).

// Defaults of ShardConfig: few shards keep the core light; a short member
// lease makes takeovers (and the faults that cause them) quick.
const (
	DefaultShards        = 16
	DefaultShardLeaseTTL = 2 * time.Second
)

// ShardConfig makes a replica run the shard-owner core.
type ShardConfig struct {
	// Shards is the shard count (DefaultShards if 0); every replica of a
	// cluster must use the same.
	Shards int
	// LeaseTTL is the member lease (DefaultShardLeaseTTL if 0).
	LeaseTTL time.Duration
	// Relay makes the replica a relay: it owns nothing, forwards every call.
	Relay bool
	// Rate, if neither 0 nor 1, runs the member's clock (its lease
	// deadline and its tables) at this rate (shard.SkewedClock; 1.05: 5%
	// fast), a fresh clock from each start.
	Rate float64
	// MemberID is the member's id, kept across restarts ("r<ID>" if empty).
	MemberID string
}

func (sc *ShardConfig) shards() int {
	if sc.Shards > 0 {
		return sc.Shards
	}
	return DefaultShards
}

func (sc *ShardConfig) ttl() time.Duration {
	if sc.LeaseTTL > 0 {
		return sc.LeaseTTL
	}
	return DefaultShardLeaseTTL
}

// options are the shard core's options of replica r listening on addr.
func (sc *ShardConfig) options(r *Replica, addr string) []shard.OwnerOption {
	id := sc.MemberID
	if id == "" {
		id = fmt.Sprintf("r%d", r.ID)
	}
	opts := []shard.OwnerOption{shard.WithShards(sc.shards()), shard.WithLeaseTTL(sc.ttl()),
		shard.WithMember(id, addr), shard.WithOwnerLogger(r.Events.Logger())}
	if sc.Relay {
		opts = append(opts, shard.AsRelay())
	}
	if sc.Rate != 0 && sc.Rate != 1 {
		opts = append(opts, shard.WithClock(shard.SkewedClock(sc.Rate)))
	}
	return opts
}

// NewShardReplica starts a replica of the shard-owner core (a member, or a
// relay if sc.Relay) with a proxy in front of every member of c. Its
// address, and so the address its peers forward to, is kept across Crash,
// Stop and Restart.
func NewShardReplica(id int, c *Cluster, sc ShardConfig, opts ...grpc.ServerOption) (*Replica, error) {
	return newReplica(id, c, &sc, opts...)
}

// ShardConfig is the replica's shard-core configuration, nil on the queue
// core.
func (r *Replica) ShardConfig() *ShardConfig { return r.shardCfg }

// IsMember tells whether the replica is a member of the shard core (not a
// relay, not on the queue core).
func (r *Replica) IsMember() bool { return r.shardCfg != nil && !r.shardCfg.Relay }

// Owner is the running replica's shard-owner core, nil if it does not run
// or runs the queue core. It does not wait for a Crash, Stop or Restart in
// progress.
func (r *Replica) Owner() *shard.Owner { return r.owner.Load() }

// Owns tells whether the replica runs and owns name's shard now (it may
// still be loading it).
func (r *Replica) Owns(name string) bool {
	o := r.Owner()
	if o == nil || !r.IsMember() {
		return false
	}
	_, ok := o.Ownership().Owned(o.ShardOf(name))
	return ok
}

// OwnedShards is how many shards the running member owns now.
func (r *Replica) OwnedShards() int {
	o := r.Owner()
	if o == nil || !r.IsMember() {
		return 0
	}
	n := 0
	for s := range uint32(o.Ownership().ShardCount()) {
		if _, ok := o.Ownership().Owned(s); ok {
			n++
		}
	}
	return n
}

// LeaseLost tells whether the running member's lease is gone: etcd expired
// it (the member was cut off past its TTL) or it was closed. Such a member
// owns nothing and campaigns no more until it is restarted (shard.Ownership:
// "the caller makes a new Lease and Ownership", which nothing does yet).
func (r *Replica) LeaseLost() bool {
	o := r.Owner()
	if o == nil || !r.IsMember() {
		return false
	}
	select {
	case <-o.Lease().Lost():
		return true
	default:
		return false
	}
}

// LeaseValid tells whether the running member's lease deadline has not
// passed (it may answer for its shards).
func (r *Replica) LeaseValid() bool {
	o := r.Owner()
	if o == nil || !r.IsMember() {
		return false
	}
	return o.Lease().Valid()
}

// Stop stops the replica gracefully, as a rolling restart does: it drains
// (the shard core hands its shards over, the calls in flight finish within
// timeout), then closes. It tells whether calls were cut at the timeout.
func (r *Replica) Stop(timeout time.Duration) (cut bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.running {
		return false
	}
	r.running = false
	r.owner.Store(nil)
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	cut = r.coord.Drain(ctx)
	cancel()
	r.coord.Close()
	r.stopEnds()
	return cut
}

// NewShardEnv starts a 3-member etcd cluster under dir and one shard-core
// replica per configuration (members and relays, in that order of ids),
// and waits until every shard is owned by a member and every replica
// agrees on the owners.
func NewShardEnv(dir string, cfgs []ShardConfig, opts ...grpc.ServerOption) (*Env, error) {
	c, err := StartCluster(dir, 3)
	if err != nil {
		return nil, err
	}
	e := &Env{Cluster: c}
	if e.Etcd, err = c.Client(); err != nil {
		e.Close()
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := Ready(ctx, e.Etcd); err != nil {
		e.Close()
		return nil, err
	}
	for i, sc := range cfgs {
		r, err := NewShardReplica(i, c, sc, opts...)
		if err != nil {
			e.Close()
			return nil, err
		}
		e.Replicas = append(e.Replicas, r)
	}
	if err := e.WaitShards(ctx); err != nil {
		e.Close()
		return nil, err
	}
	e.Compactor = StartCompactor(e.Etcd)
	return e, nil
}

// WaitShards waits until every shard is owned by a running member, every
// running member owns at least one, and every running replica (relays
// too) sees the same owner for each.
func (e *Env) WaitShards(ctx context.Context) error {
	for {
		if e.shardsSettled() {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("chaos: the shards are not split among the members: %w", ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func (e *Env) shardsSettled() bool {
	var members, all []*Replica
	for _, r := range e.Replicas {
		if r.Owner() == nil {
			continue
		}
		all = append(all, r)
		if r.IsMember() {
			members = append(members, r)
		}
	}
	if len(members) == 0 {
		return false
	}
	count := members[0].Owner().Ownership().ShardCount()
	for _, m := range members {
		if m.OwnedShards() == 0 {
			return false
		}
	}
	for s := range uint32(count) {
		owners := 0
		var id string
		for _, m := range members {
			o := m.Owner()
			if o == nil {
				return false
			}
			if _, ok := o.Ownership().Owned(s); ok {
				owners++
				id, _, _ = o.Ownership().Owner(s)
			}
		}
		if owners != 1 {
			return false
		}
		for _, r := range all {
			o := r.Owner()
			if o == nil {
				return false
			}
			if got, _, ok := o.Ownership().Owner(s); !ok || got != id {
				return false
			}
		}
	}
	return true
}

// OwnerOf is the running member that owns name's shard now, or nil.
func (e *Env) OwnerOf(name string) *Replica {
	for _, r := range e.Replicas {
		if r.Owns(name) {
			return r
		}
	}
	return nil
}
