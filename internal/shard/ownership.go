package shard

// Ownership decides which member owns which shard, and tells the runtime
// (Callbacks) when this member starts and stops owning one.
//
// What it guarantees, and why:
//
//   - At most one owner key per shard: a member takes a shard only with
//     Txn If(CreateRevision(owner key) == 0) Then(Put(owner key, id, its
//     lease)); the key's create revision is the owner's fence (S1), and its
//     lease ends the ownership when the member stops renewing (S2, lease.go).
//   - Guard is ok only between Acquired and Lost, and only while the lease
//     is Valid: the committer fences every write with it.
//   - On a graceful hand-over (Release, rebalancing, HandOver, Close) Lost
//     is called, and returns, BEFORE the owner key is deleted: the next
//     owner needs the key gone to win it, so its Acquired always follows
//     this Lost. The Guard still holds while such a Lost runs, so the
//     runtime can let what it has in flight commit and answer it first (a
//     release dropped in flight was answered UNAVAILABLE though it
//     committed, and its retry then released nothing); it ends when Lost
//     returns. When the shard is lost instead (its key deleted or replaced,
//     the lease lost) the Guard ends before Lost is called.
//   - Callbacks of one Ownership are serialized, except that a graceful
//     hand-over calls Lost for all its shards at once (each may wait for a
//     commit; one after another, a member handing 85 shards over waited
//     for 85 of them): for each shard, Acquired and Lost alternate,
//     starting with Acquired. They must not call Release, HandOver or Close
//     (those wait for the callback in progress).
//   - Assignment is rendezvous (highest random weight) hashing of (shard,
//     member id) over the live members (their member keys present), so a
//     member joining or leaving moves only the shards it gains or loses.
//   - No flapping: a member hands over only a shard whose assignee is a
//     live member other than itself (and not the assignee that had failed
//     to take it, for an adopted shard); it campaigns for the free shards
//     assigned to it, and for free shards nobody took for WithAdoptAfter.
//   - A batch never carries two operations on one key (etcd #22376,
//     #16380) nor more than ownMaxTxnOps compares or operations (etcd's
//     --max-txn-ops).
//
// One goroutine (run) owns the view: an initial Get of <prefix>shards/ and
// a watch from its revision + 1, re-read after a watch error or a
// compaction; after each change and on a tick it reconciles (reconcile).
// It keeps following the view after HandOver (Owner names the next owners,
// for the forwarding of calls still arriving) until Close.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

const (
	ownDefaultCount      = 256
	ownMaxCount          = 1 << 16
	ownMaxTxnOps         = 128 // etcd's default --max-txn-ops
	ownDefaultAdoptAfter = 3 * time.Second
	ownRetry             = 200 * time.Millisecond // between reads of an unreachable etcd
)

// Member is a registered member replica: its id and the address peers
// forward its shards' calls to.
type Member struct {
	ID   string `json:"id"`
	Addr string `json:"addr"`
}

// Callbacks tell the runtime about this member's shards. Acquired: this
// member won shard (rev is the owner key's create revision, the fence);
// load it and serve it. Lost: it no longer owns it (key deleted, replaced,
// handed over, or the lease lost); when Lost returns the runtime answers
// nothing more for the shard. Either may be nil.
type Callbacks struct {
	Acquired func(shard uint32, rev int64)
	Lost     func(shard uint32)
}

type ownershipOptions struct {
	count      int
	id         string
	addr       string
	relay      bool
	log        *slog.Logger
	adoptAfter time.Duration
}

// OwnershipOption configures NewOwnership.
type OwnershipOption func(*ownershipOptions)

// WithShardCount sets the number of shards (default 256). It is stored at
// first start and can change only with an empty keyspace.
func WithShardCount(n int) OwnershipOption { return func(o *ownershipOptions) { o.count = n } }

// WithMemberID sets this member's id (default: 16 random hex digits). Ids
// must be unique among live members; a member restarted with its old id
// waits for the old lease's owner keys to expire before owning them again.
func WithMemberID(id string) OwnershipOption { return func(o *ownershipOptions) { o.id = id } }

// WithAdvertise sets the address peers forward this member's shards to.
func WithAdvertise(addr string) OwnershipOption { return func(o *ownershipOptions) { o.addr = addr } }

// WithRole makes the replica a relay (relay true): it registers nothing,
// owns nothing and only looks up owners. A relay needs no lease.
func WithRole(relay bool) OwnershipOption { return func(o *ownershipOptions) { o.relay = relay } }

// WithOwnershipLogger sets the logger (default: discard).
func WithOwnershipLogger(l *slog.Logger) OwnershipOption {
	return func(o *ownershipOptions) { o.log = l }
}

// WithAdoptAfter sets how long a shard may stay free while its assignee
// does not take it (it is slow or stuck) before any member campaigns for
// it (default 3s; 0 at once). The adopter keeps it until another member
// becomes its assignee, so a stuck assignee makes no shard flap; the price
// is an uneven split until the membership changes.
func WithAdoptAfter(d time.Duration) OwnershipOption {
	return func(o *ownershipOptions) { o.adoptAfter = max(d, 0) }
}

// Ownership is this member's view of shard ownership and its campaign.
type Ownership struct {
	cli   *clientv3.Client
	keys  ownKeys
	lease *Lease // nil for a relay
	cb    Callbacks
	opts  ownershipOptions
	log   *slog.Logger

	cbMu sync.Mutex // held across each transition and its callback; before mu

	mu         sync.Mutex
	members    map[string]Member
	slots      []ownSlot // the view of each shard's owner key
	assign     []string  // each shard's assignee; nil when members changed
	owned      map[uint32]int64
	adopted    map[uint32]string // owned shards taken from an assignee that did not take them
	changed    chan struct{}     // closed at the view's next change (Changed)
	closing    bool              // HandOver began: no campaign, no hand-over but its own
	handedOver bool              // HandOver ended: keys on our lease are orphans
	leaseGone  bool

	cancel       context.CancelFunc
	done         chan struct{}
	handOverOnce sync.Once
	closeOnce    sync.Once
}

// ownSlot is the view of one owner key; create == 0: no key (free since
// freeSince). mod is the last revision applied, so older news is ignored.
type ownSlot struct {
	id          string
	create, mod int64
	lease       clientv3.LeaseID
	freeSince   time.Time
}

// ownTerm is one ownership term of a shard: its owner key's create revision.
type ownTerm struct {
	shard uint32
	rev   int64
}

// NewOwnership checks (or stores) the shard count, registers the member
// (unless a relay), reads the current owners and starts the goroutine that
// follows them and campaigns. lease may be nil for a relay.
func NewOwnership(ctx context.Context, cli *clientv3.Client, prefix string, lease *Lease, cb Callbacks, opts ...OwnershipOption) (*Ownership, error) {
	o, err := newOwnership(cli, prefix, lease, cb, opts)
	if err != nil {
		return nil, err
	}
	if err := ownStoreCount(ctx, cli, o.keys.count, o.opts.count); err != nil {
		return nil, err
	}
	if err := o.register(ctx); err != nil {
		return nil, err
	}
	rev, err := o.load(ctx)
	if err != nil {
		o.deregister(ctx)
		return nil, fmt.Errorf("shard ownership: read owners: %w", err)
	}
	lctx, cancel := context.WithCancel(context.Background())
	o.cancel = cancel
	go o.run(lctx, rev)
	return o, nil
}

// newOwnership applies and checks the options.
func newOwnership(cli *clientv3.Client, prefix string, lease *Lease, cb Callbacks, opts []OwnershipOption) (*Ownership, error) {
	o := ownershipOptions{count: ownDefaultCount, adoptAfter: ownDefaultAdoptAfter}
	for _, opt := range opts {
		opt(&o)
	}
	if o.count < 1 || o.count > ownMaxCount {
		return nil, fmt.Errorf("shard ownership: shard count %d: want 1 to %d", o.count, ownMaxCount)
	}
	if o.id == "" {
		o.id = ownRandomID()
	}
	if !o.relay && lease == nil {
		return nil, fmt.Errorf("shard ownership: a member needs a lease")
	}
	if o.relay {
		lease = nil
	}
	if o.log == nil {
		o.log = slog.New(slog.DiscardHandler)
	}
	return &Ownership{cli: cli, keys: ownKeysFor(prefix), lease: lease, cb: cb, opts: o,
		log: o.log.With("member", o.id), members: map[string]Member{}, slots: make([]ownSlot, o.count),
		owned: map[uint32]int64{}, adopted: map[uint32]string{}, changed: make(chan struct{}), done: make(chan struct{})}, nil
}

func ownRandomID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// ownStoreCount writes the shard count at first start and refuses another.
func ownStoreCount(ctx context.Context, kv clientv3.KV, key string, n int) error {
	want := strconv.Itoa(n)
	resp, err := kv.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
		Then(clientv3.OpPut(key, want)).Else(clientv3.OpGet(key)).Commit()
	if err != nil {
		return fmt.Errorf("shard count: %w", err)
	}
	if resp.Succeeded {
		return nil
	}
	var stored string
	if kvs := resp.Responses[0].GetResponseRange().GetKvs(); len(kvs) > 0 {
		stored = string(kvs[0].Value)
	}
	if stored != want {
		return fmt.Errorf("shard count: the keyspace holds %s shards (%s), this replica asks for %d: "+
			"changing the shard count requires an empty keyspace (a new prefix or a fresh etcd)", stored, key, n)
	}
	return nil
}

// ShardCount is the number of shards.
func (o *Ownership) ShardCount() int { return o.opts.count }

// ShardOf is the shard of name: FNV-1a (64 bits) of its bytes, modulo
// count (which must be positive). It is part of the stored format (a
// name's state lives under its shard), so it never changes.
func ShardOf(name string, count int) uint32 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(name))
	return uint32(h.Sum64() % uint64(count))
}

// Owner is shard's owner in this member's view: its id and address; ok
// false if the shard has no owner key or its owner is not a registered
// member (it is leaving or dead).
func (o *Ownership) Owner(shard uint32) (memberID, addr string, ok bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if int(shard) >= len(o.slots) || o.slots[shard].create == 0 {
		return "", "", false
	}
	m, ok := o.members[o.slots[shard].id]
	return m.ID, m.Addr, ok
}

// Owned is this member's fence for shard (the owner key's create
// revision), ok while it owns it (between Acquired and Lost).
func (o *Ownership) Owned(shard uint32) (rev int64, ok bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	rev, ok = o.owned[shard]
	return rev, ok
}

// Guard is the committer's fence for shard: the owner key and its create
// revision, ok only while this member owns the shard and its lease is
// Valid.
func (o *Ownership) Guard(shard uint32) (key string, createRev int64, ok bool) {
	rev, owned := o.Owned(shard)
	if !owned || o.lease == nil || !o.lease.Valid() {
		return "", 0, false
	}
	return o.keys.owner(shard), rev, true
}

// Members are the registered members in this member's view, by id.
func (o *Ownership) Members() []Member {
	o.mu.Lock()
	defer o.mu.Unlock()
	ms := make([]Member, 0, len(o.members))
	for _, m := range o.members {
		ms = append(ms, m)
	}
	slices.SortFunc(ms, func(a, b Member) int { return strings.Compare(a.ID, b.ID) })
	return ms
}

// Release hands shard over gracefully: Lost, then the owner key deleted if
// its create revision is still ours. A shard assigned to this member is
// campaigned for again at once. If the delete fails the key stays until
// this member's loop deletes it or its lease ends; nobody else owns the
// shard meanwhile.
func (o *Ownership) Release(ctx context.Context, shard uint32) error {
	ended := o.handOff([]ownTerm{{shard, 0}})
	if len(ended) == 0 {
		return nil
	}
	if err := o.deleteTerms(ctx, ended); err != nil {
		return fmt.Errorf("shard %d: delete owner key: %w", shard, err)
	}
	return nil
}

// HandOver hands every owned shard over gracefully and campaigns no more,
// but keeps following the view until Close (Owner names the next owners,
// for forwarding the calls that still arrive here): Lost for every owned
// shard (graceful: all at once, the Guard holding), then one Txn
// deregisters the member and deletes their owner keys, so that the other
// members see it gone and the shards free in one watch event and campaign
// for them at once. It tries etcd within ctx and at most the lease's TTL
// (an unreachable etcd expires the keys with the lease). Idempotent.
func (o *Ownership) HandOver(ctx context.Context) {
	o.handOverOnce.Do(func() {
		o.mu.Lock()
		o.closing = true
		gone := o.leaseGone // the keys went with the lease
		o.mu.Unlock()
		if o.lease == nil || gone {
			return
		}
		ctx, cancel := context.WithTimeout(ctx, o.lease.TTL())
		defer cancel()
		o.leave(ctx, o.handOff(o.ownedTerms()))
		o.mu.Lock()
		o.handedOver = true
		o.mu.Unlock()
	})
}

// Close hands over every owned shard and leaves (HandOver), then stops the
// goroutine and sweeps: it deregisters the member again (a registration
// may have raced with the hand-over) and deletes any owner key left on
// this member's lease (an ambiguous campaign's), within ctx and at most
// the lease's TTL. It does not close the lease (the caller does).
// Idempotent.
func (o *Ownership) Close(ctx context.Context) {
	o.closeOnce.Do(func() {
		o.HandOver(ctx)
		o.cancel()
		<-o.done
		if o.lease == nil {
			return
		}
		ctx, cancel := context.WithTimeout(ctx, o.lease.TTL())
		defer cancel()
		o.deregister(ctx)
		o.handOverAll(ctx)
	})
}

// Changed is closed at the view's next change (an owner key or a member
// key written, deleted or read again): a caller waiting for a shard's
// next owner re-reads Owner then, rather than after a fixed pause.
func (o *Ownership) Changed() <-chan struct{} {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.changed
}

// changedLocked wakes the callers waiting on Changed (under o.mu).
func (o *Ownership) changedLocked() {
	close(o.changed)
	o.changed = make(chan struct{})
}

// leave deregisters the member and deletes the owner keys of terms (its
// last shards, handed off) in one Txn, one compare per key; if a compare
// fails (the member key gone or not ours, a key no longer ours) or the
// batch would pass ownMaxTxnOps, one step at a time: the member key, then
// the owner keys (deleteTerms). Deregistering first, or together, matters:
// a shard freed while its assignee is still this member is left to the
// adopters (WithAdoptAfter).
func (o *Ownership) leave(ctx context.Context, terms []ownTerm) {
	if len(terms) > 0 && len(terms) < ownMaxTxnOps {
		if o.leaveTxn(ctx, terms) {
			return
		}
	}
	o.deregister(ctx)
	if err := o.deleteTerms(ctx, terms); err != nil {
		o.log.Warn("shard ownership: hand-over: owner keys stay until the lease ends", "err", err)
	}
}

// leaveTxn is leave's one Txn; false if it failed or a compare did.
func (o *Ownership) leaveTxn(ctx context.Context, terms []ownTerm) bool {
	key := o.keys.member(o.opts.id)
	cmps := []clientv3.Cmp{clientv3.Compare(clientv3.LeaseValue(key), "=", o.lease.ID())}
	dels := []clientv3.Op{clientv3.OpDelete(key)}
	for _, t := range terms {
		owner := o.keys.owner(t.shard)
		cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(owner), "=", t.rev))
		dels = append(dels, clientv3.OpDelete(owner))
	}
	resp, err := o.cli.Txn(ctx).If(cmps...).Then(dels...).Commit()
	if err != nil || !resp.Succeeded {
		return false
	}
	o.markFree(terms, resp.Header.Revision)
	return true
}

// handOverAll hands off every owned shard, then deletes every owner key on
// this member's lease: the owned ones, and any an ambiguous campaign left
// behind.
func (o *Ownership) handOverAll(ctx context.Context) {
	terms := o.handOff(o.ownedTerms())
	if resp, err := o.cli.Get(ctx, o.keys.owners, clientv3.WithPrefix()); err == nil {
		terms = nil
		for _, kv := range resp.Kvs {
			if s, ok := o.keys.shard(string(kv.Key), o.opts.count); ok && clientv3.LeaseID(kv.Lease) == o.lease.ID() {
				terms = append(terms, ownTerm{s, kv.CreateRevision})
			}
		}
	}
	if err := o.deleteTerms(ctx, terms); err != nil {
		o.log.Warn("shard ownership: close: owner keys stay until the lease ends", "err", err)
	}
}

// register puts this member's key on its lease.
func (o *Ownership) register(ctx context.Context) error {
	if o.lease == nil {
		return nil
	}
	v, _ := json.Marshal(Member{ID: o.opts.id, Addr: o.opts.addr})
	if _, err := o.cli.Put(ctx, o.keys.member(o.opts.id), string(v), clientv3.WithLease(o.lease.ID())); err != nil {
		return fmt.Errorf("shard ownership: register member %s: %w", o.opts.id, err)
	}
	return nil
}

// deregister deletes this member's key if it is still on our lease.
func (o *Ownership) deregister(ctx context.Context) {
	if o.lease == nil {
		return
	}
	key := o.keys.member(o.opts.id)
	_, err := o.cli.Txn(ctx).If(clientv3.Compare(clientv3.LeaseValue(key), "=", o.lease.ID())).
		Then(clientv3.OpDelete(key)).Commit()
	if err != nil {
		o.log.Warn("shard ownership: deregister failed; the member key ends with the lease", "err", err)
	}
}
