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
//   - On a graceful hand-over (Release, rebalancing, Close) Lost is called,
//     and returns, BEFORE the owner key is deleted: the next owner needs
//     the key gone to win it, so its Acquired always follows this Lost.
//   - Callbacks of one Ownership are serialized: for each shard, Acquired
//     and Lost alternate, starting with Acquired. They must not call
//     Release or Close (those wait for the callback in progress).
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

	mu        sync.Mutex
	members   map[string]Member
	slots     []ownSlot // the view of each shard's owner key
	assign    []string  // each shard's assignee; nil when members changed
	owned     map[uint32]int64
	adopted   map[uint32]string // owned shards taken from an assignee that did not take them
	closing   bool
	leaseGone bool

	cancel    context.CancelFunc
	done      chan struct{}
	closeOnce sync.Once
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
		owned: map[uint32]int64{}, adopted: map[uint32]string{}, done: make(chan struct{})}, nil
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
	rev, ok := o.drop(shard, 0)
	if !ok {
		return nil
	}
	if err := o.deleteTerms(ctx, []ownTerm{{shard, rev}}); err != nil {
		return fmt.Errorf("shard %d: delete owner key: %w", shard, err)
	}
	return nil
}

// Close hands over every owned shard and leaves: it stops the goroutine,
// deregisters the member (so that the others stop assigning it shards),
// calls Lost for each owned shard and then deletes its owner keys, trying
// etcd within ctx and at most the lease's TTL (an unreachable etcd expires
// the keys with the lease). It does not close the lease (the caller does).
// Idempotent.
func (o *Ownership) Close(ctx context.Context) {
	o.closeOnce.Do(func() {
		o.mu.Lock()
		o.closing = true
		o.mu.Unlock()
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

// handOverAll calls Lost for every owned shard, then deletes every owner
// key on this member's lease: the owned ones, and any an ambiguous campaign
// left behind.
func (o *Ownership) handOverAll(ctx context.Context) {
	terms := o.dropAll()
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

// run is the goroutine: follow the view from rev and reconcile, re-read
// after a watch ends, until Close.
func (o *Ownership) run(ctx context.Context, rev int64) {
	defer close(o.done)
	tick := time.NewTicker(min(max(o.opts.adoptAfter/4, 50*time.Millisecond), time.Second))
	defer tick.Stop()
	for ctx.Err() == nil {
		o.reconcile(ctx)
		o.follow(ctx, rev+1, tick.C)
		rev = o.reload(ctx)
	}
}

// follow applies the watch's events from revision from, and reconciles
// after each change and tick, until the watch fails or ctx ends.
func (o *Ownership) follow(ctx context.Context, from int64, tick <-chan time.Time) {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	wch := o.cli.Watch(wctx, o.keys.root, clientv3.WithPrefix(), clientv3.WithRev(from))
	for {
		select {
		case <-ctx.Done():
			return
		case <-o.leaseLost():
			o.loseLease()
		case <-tick:
		case resp, ok := <-wch:
			if !ok || resp.Err() != nil || resp.Canceled {
				o.log.Debug("shard ownership: watch ended; reading again", "err", resp.Err())
				return
			}
			o.apply(resp.Events)
		}
		o.reconcile(ctx)
	}
}

// reload reads the view again, retrying until it succeeds or ctx ends.
func (o *Ownership) reload(ctx context.Context) int64 {
	for {
		select {
		case <-ctx.Done():
			return 0
		case <-o.leaseLost():
			o.loseLease()
		case <-time.After(ownRetry):
		}
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		rev, err := o.load(rctx)
		cancel()
		if err == nil {
			return rev
		}
		o.log.Debug("shard ownership: read failed", "err", err)
	}
}

// load replaces the view with a read of <prefix>shards/, drops the shards
// it shows are no longer ours, and returns the read's revision.
func (o *Ownership) load(ctx context.Context) (int64, error) {
	resp, err := o.cli.Get(ctx, o.keys.root, clientv3.WithPrefix())
	if err != nil {
		return 0, err
	}
	now := time.Now()
	o.mu.Lock()
	old := o.slots
	o.members, o.slots, o.assign = map[string]Member{}, make([]ownSlot, o.opts.count), nil
	for _, kv := range resp.Kvs {
		o.applyLocked(&clientv3.Event{Type: clientv3.EventTypePut, Kv: kv}, now)
	}
	for s := range o.slots {
		if v := &o.slots[s]; v.create == 0 {
			v.mod, v.freeSince = resp.Header.Revision, now
			if old[s].create == 0 && !old[s].freeSince.IsZero() {
				v.freeSince = old[s].freeSince
			}
		}
	}
	lost := o.lostLocked()
	o.mu.Unlock()
	o.dropTerms(lost)
	return resp.Header.Revision, nil
}

// apply applies watch events to the view and drops the shards they show
// are no longer ours.
func (o *Ownership) apply(evs []*clientv3.Event) {
	now := time.Now()
	o.mu.Lock()
	for _, ev := range evs {
		o.applyLocked(ev, now)
	}
	lost := o.lostLocked()
	o.mu.Unlock()
	o.dropTerms(lost)
}

// applyLocked applies one change of a member or owner key.
func (o *Ownership) applyLocked(ev *clientv3.Event, now time.Time) {
	key := string(ev.Kv.Key)
	if id, ok := strings.CutPrefix(key, o.keys.members); ok {
		delete(o.members, id)
		if ev.Type == clientv3.EventTypePut {
			m := Member{ID: id}
			if err := json.Unmarshal(ev.Kv.Value, &m); err != nil {
				o.log.Warn("shard ownership: unreadable member key", "key", key, "err", err)
			}
			m.ID = id
			o.members[id] = m
		}
		o.assign = nil
		return
	}
	s, ok := o.keys.shard(key, o.opts.count)
	if !ok || ev.Kv.ModRevision <= o.slots[s].mod {
		return
	}
	if ev.Type == clientv3.EventTypeDelete {
		o.slots[s] = ownSlot{mod: ev.Kv.ModRevision, freeSince: now}
		return
	}
	o.slots[s] = ownSlot{id: string(ev.Kv.Value), create: ev.Kv.CreateRevision, mod: ev.Kv.ModRevision,
		lease: clientv3.LeaseID(ev.Kv.Lease)}
}

// lostLocked lists the owned terms whose owner key the view no longer
// shows (deleted, or created again).
func (o *Ownership) lostLocked() []ownTerm {
	var lost []ownTerm
	for s, rev := range o.owned {
		if o.slots[s].create != rev {
			lost = append(lost, ownTerm{s, rev})
		}
	}
	return lost
}

// ownPlan is what reconcile does next.
type ownPlan struct {
	register bool
	orphans  []ownTerm // keys on our lease that we do not own (ambiguous campaigns)
	handOver []ownTerm
	campaign []uint32
	adopt    map[uint32]string // campaigned shards that are not ours: their assignee
}

// reconcile acts on the view: register again if the member key is gone,
// delete orphan keys, hand over shards assigned to other members, and
// campaign for free shards assigned to us or left free too long.
func (o *Ownership) reconcile(ctx context.Context) {
	if o.lease == nil {
		return
	}
	p := o.plan(time.Now())
	if p.register {
		if err := o.register(ctx); err != nil {
			o.log.Warn("shard ownership: register again", "err", err)
		}
		return
	}
	if err := o.deleteTerms(ctx, p.orphans); err != nil {
		o.log.Debug("shard ownership: delete orphan owner keys", "err", err)
	}
	o.handOver(ctx, p.handOver)
	for len(p.campaign) > 0 && ctx.Err() == nil {
		n := min(len(p.campaign), ownMaxTxnOps)
		o.campaign(ctx, p.campaign[:n], p.adopt)
		p.campaign = p.campaign[n:]
	}
}

// plan reads the view into an ownPlan.
func (o *Ownership) plan(now time.Time) ownPlan {
	o.mu.Lock()
	defer o.mu.Unlock()
	var p ownPlan
	if o.closing || o.leaseGone {
		return p
	}
	id := o.opts.id
	if _, ok := o.members[id]; !ok {
		p.register = true
		return p
	}
	assign := o.assignmentLocked()
	for i, v := range o.slots {
		s, a := uint32(i), assign[i]
		rev, mine := o.owned[s]
		switch {
		case mine:
			if a != id && o.adopted[s] != a {
				p.handOver = append(p.handOver, ownTerm{s, rev})
			}
		case v.create != 0:
			if v.lease == o.lease.ID() {
				p.orphans = append(p.orphans, ownTerm{s, v.create})
			}
		case a == id:
			p.campaign = append(p.campaign, s)
		case now.Sub(v.freeSince) >= o.opts.adoptAfter:
			if p.adopt == nil {
				p.adopt = map[uint32]string{}
			}
			p.campaign, p.adopt[s] = append(p.campaign, s), a
		}
	}
	return p
}

// assignmentLocked is each shard's assignee among the live members.
func (o *Ownership) assignmentLocked() []string {
	if o.assign == nil {
		ids := make([]string, 0, len(o.members))
		for id := range o.members {
			ids = append(ids, id)
		}
		o.assign = make([]string, len(o.slots))
		for s := range o.assign {
			o.assign[s] = ownAssignee(uint32(s), ids)
		}
	}
	return o.assign
}

// ownAssignee is the member with the highest rendezvous weight for shard
// (ties to the greater id); "" if there is none.
func ownAssignee(shard uint32, ids []string) string {
	var best string
	var bestW uint64
	for _, id := range ids {
		w := ownWeight(shard, id)
		if best == "" || w > bestW || (w == bestW && id > best) {
			best, bestW = id, w
		}
	}
	return best
}

// ownWeight mixes FNV-1a of the id with the shard through splitmix64's
// finalizer: FNV alone scatters the last bytes poorly.
func ownWeight(shard uint32, id string) uint64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(id))
	return ownMix(h.Sum64() ^ ownMix(uint64(shard)+0x9e3779b97f4a7c15))
}

func ownMix(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	return x ^ x>>31
}

// handOver gives shards to their assignees: Lost for each, then their keys
// deleted.
func (o *Ownership) handOver(ctx context.Context, terms []ownTerm) {
	var dropped []ownTerm
	for _, t := range terms {
		if _, ok := o.drop(t.shard, t.rev); ok {
			dropped = append(dropped, t)
		}
	}
	if len(dropped) == 0 {
		return
	}
	o.log.Info("shard ownership: handing over shards", "count", len(dropped))
	if err := o.deleteTerms(ctx, dropped); err != nil {
		o.log.Warn("shard ownership: hand-over: owner keys stay for now", "err", err)
	}
}

// campaign tries to take free shards (at most ownMaxTxnOps) in one Txn, one
// compare and one put per shard; if one was taken meanwhile, one by one.
// An error leaves the outcome unknown: a key won that way is on our lease
// but not owned, and is deleted as an orphan.
func (o *Ownership) campaign(ctx context.Context, shards []uint32, adopt map[uint32]string) {
	cmps := make([]clientv3.Cmp, len(shards))
	puts := make([]clientv3.Op, len(shards))
	for i, s := range shards {
		key := o.keys.owner(s)
		cmps[i] = clientv3.Compare(clientv3.CreateRevision(key), "=", 0)
		puts[i] = clientv3.OpPut(key, o.opts.id, clientv3.WithLease(o.lease.ID()))
	}
	resp, err := o.cli.Txn(ctx).If(cmps...).Then(puts...).Commit()
	switch {
	case err != nil:
		o.log.Debug("shard ownership: campaign failed", "shards", len(shards), "err", err)
	case resp.Succeeded:
		for _, s := range shards {
			o.acquire(s, resp.Header.Revision, adopt[s])
		}
	case len(shards) > 1:
		for _, s := range shards {
			o.campaign(ctx, []uint32{s}, adopt)
		}
	}
}

// deleteTerms deletes the owner keys of terms, each only if its create
// revision is still the term's, at most ownMaxTxnOps per Txn; a key already
// gone or created again is no longer ours, which is success.
func (o *Ownership) deleteTerms(ctx context.Context, terms []ownTerm) error {
	var first error
	for len(terms) > 0 {
		n := min(len(terms), ownMaxTxnOps)
		if err := o.deleteBatch(ctx, terms[:n]); err != nil && first == nil {
			first = err
		}
		terms = terms[n:]
	}
	return first
}

func (o *Ownership) deleteBatch(ctx context.Context, terms []ownTerm) error {
	cmps := make([]clientv3.Cmp, len(terms))
	dels := make([]clientv3.Op, len(terms))
	for i, t := range terms {
		key := o.keys.owner(t.shard)
		cmps[i] = clientv3.Compare(clientv3.CreateRevision(key), "=", t.rev)
		dels[i] = clientv3.OpDelete(key)
	}
	resp, err := o.cli.Txn(ctx).If(cmps...).Then(dels...).Commit()
	if err != nil {
		return err
	}
	switch {
	case resp.Succeeded:
		o.markFree(terms, resp.Header.Revision)
	case len(terms) > 1:
		var first error
		for i := range terms {
			if err := o.deleteBatch(ctx, terms[i:i+1]); err != nil && first == nil {
				first = err
			}
		}
		return first
	}
	return nil
}

// markFree records in the view that our delete at rev freed terms' keys.
func (o *Ownership) markFree(terms []ownTerm, rev int64) {
	now := time.Now()
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, t := range terms {
		if o.slots[t.shard].mod < rev {
			o.slots[t.shard] = ownSlot{mod: rev, freeSince: now}
		}
	}
}

// acquire records that we won shard at rev and calls Acquired, unless we
// are closing or lost the lease meanwhile (Close deletes the key; a lost
// lease took it).
func (o *Ownership) acquire(shard uint32, rev int64, adoptedFrom string) {
	o.cbMu.Lock()
	defer o.cbMu.Unlock()
	o.mu.Lock()
	if o.slots[shard].mod < rev {
		o.slots[shard] = ownSlot{id: o.opts.id, create: rev, mod: rev, lease: o.lease.ID()}
	}
	if o.closing || o.leaseGone {
		o.mu.Unlock()
		return
	}
	o.owned[shard] = rev
	if adoptedFrom != "" {
		o.adopted[shard] = adoptedFrom
	}
	o.mu.Unlock()
	o.log.Debug("shard ownership: acquired", "shard", shard, "rev", rev)
	if o.cb.Acquired != nil {
		o.cb.Acquired(shard, rev)
	}
}

// drop ends our ownership of shard (of its term rev; 0: any) and calls
// Lost; it reports the term it ended.
func (o *Ownership) drop(shard uint32, rev int64) (int64, bool) {
	o.cbMu.Lock()
	defer o.cbMu.Unlock()
	o.mu.Lock()
	have, ok := o.owned[shard]
	if !ok || (rev != 0 && have != rev) {
		o.mu.Unlock()
		return 0, false
	}
	delete(o.owned, shard)
	delete(o.adopted, shard)
	o.mu.Unlock()
	o.log.Debug("shard ownership: lost", "shard", shard, "rev", have)
	if o.cb.Lost != nil {
		o.cb.Lost(shard)
	}
	return have, true
}

func (o *Ownership) dropTerms(terms []ownTerm) {
	for _, t := range terms {
		o.drop(t.shard, t.rev)
	}
}

// dropAll ends every ownership and returns the terms it ended.
func (o *Ownership) dropAll() []ownTerm {
	o.mu.Lock()
	var terms []ownTerm
	for s, rev := range o.owned {
		terms = append(terms, ownTerm{s, rev})
	}
	o.mu.Unlock()
	var ended []ownTerm
	for _, t := range terms {
		if _, ok := o.drop(t.shard, t.rev); ok {
			ended = append(ended, t)
		}
	}
	return ended
}

// leaseLost is the lease's Lost channel until the loss is handled; nil for
// a relay and afterwards.
func (o *Ownership) leaseLost() <-chan struct{} {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.lease == nil || o.leaseGone {
		return nil
	}
	return o.lease.Lost()
}

// loseLease ends every ownership: etcd deleted our keys with the lease.
// This Ownership campaigns no more; the caller makes a new Lease and
// Ownership.
func (o *Ownership) loseLease() {
	o.mu.Lock()
	o.leaseGone = true
	o.mu.Unlock()
	n := len(o.dropAll())
	o.log.Warn("shard ownership: lease lost; every shard dropped", "shards", n)
}

// ownKeys is the key layout under a prefix.
type ownKeys struct{ root, count, members, owners string }

func ownKeysFor(prefix string) ownKeys {
	root := prefix + "shards/"
	return ownKeys{root: root, count: root + "count", members: root + "members/", owners: root + "owners/"}
}

func (k ownKeys) member(id string) string { return k.members + id }

func (k ownKeys) owner(shard uint32) string { return fmt.Sprintf("%s%05d", k.owners, shard) }

// shard parses an owner key of a shard below count.
func (k ownKeys) shard(key string, count int) (uint32, bool) {
	rest, ok := strings.CutPrefix(key, k.owners)
	if !ok {
		return 0, false
	}
	n, err := strconv.ParseUint(rest, 10, 32)
	if err != nil || n >= uint64(count) || k.owner(uint32(n)) != key {
		return 0, false
	}
	return uint32(n), true
}
