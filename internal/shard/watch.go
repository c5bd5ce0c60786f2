package shard

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/coordinatord/coordinatord/internal/etcdx"
	"github.com/coordinatord/coordinatord/internal/keyspace"
	"github.com/coordinatord/coordinatord/internal/lease"
	"github.com/coordinatord/coordinatord/internal/locktable"
)

// Watch of the grants, from etcd's history. On the shard-owner core every
// grant is one key, <prefix>shards/data/<shard>/<escaped name>/<grant id>,
// put when the grant commits (its create revision is the token) and deleted
// when it ends (release, expiry, force release); waiters and renewals are
// memory-only and never reach etcd. So a watch of those keys is the whole
// history of the holders, and it needs nothing from the owner: any replica
// (a relay, a member that does not own the name's shard) serves it with
// its own etcd client, etcd keeps the history for a resume (start
// revision) and says when it compacted it away.
//
// How a grant ended is not in its delete (a release, an expiry and a force
// release are the same delete), so the owner writes it beside: the unit
// that releases or force-releases grants also puts, per lock, an end
// marker, <prefix>shards/ended/<shard>/<escaped name>, listing their tokens
// and causes, in the revision of the deletes (locktable/ended.go; on the
// member's lease, so markers live no longer than the member that wrote
// them). A watch reads the markers of a revision's ends at that revision
// (one read per revision with ends): a grant the marker written in that
// revision lists ended as listed, any other expired.

// GrantEndUnknown is how a grant ended when its lock's end marker could
// not be read at the revision of its delete (etcd compacted that revision
// away meanwhile).
const GrantEndUnknown GrantEnd = 0

// WatchFilter chooses the grants a Watch reports: one lock's (Name), those
// of every lock whose name starts with Prefix, or every lock's (All). Only
// one of the three may be set; with none set, Name is required.
type WatchFilter struct {
	Name   string
	Prefix string
	All    bool
}

func (f WatchFilter) validate() error {
	switch {
	case f.All && (f.Name != "" || f.Prefix != ""):
		return keyspace.FieldErr("name", "a watch of every lock takes no name or prefix")
	case f.All:
		return nil
	case f.Prefix != "" && f.Name != "":
		return keyspace.FieldErr("prefix", "a watch takes a name or a prefix, not both")
	case f.Prefix != "":
		return keyspace.ValidateName("prefix", f.Prefix, false)
	}
	return keyspace.ValidateName("name", f.Name, false)
}

// matches tells whether the filter reports the lock name.
func (f WatchFilter) matches(name string) bool {
	switch {
	case f.All:
		return true
	case f.Prefix != "":
		return strings.HasPrefix(name, f.Prefix)
	}
	return name == f.Name
}

// WatchKind is what a WatchEvent reports.
type WatchKind int

// The kinds of WatchEvent.
const (
	// WatchCurrent: a holder at the revision the watch started from
	// (start revision 0), one event per holder; Holder is nil when no
	// watched lock is held (one event then).
	WatchCurrent WatchKind = iota + 1
	// WatchGranted: a new holder (its key was created).
	WatchGranted
	// WatchEnded: a holder's grant ended (its key was deleted); End says
	// how (GrantReleased, GrantExpired, GrantForced; GrantEndUnknown if
	// that was compacted away).
	WatchEnded
)

func (k WatchKind) String() string {
	switch k {
	case WatchCurrent:
		return "current"
	case WatchGranted:
		return "granted"
	case WatchEnded:
		return "ended"
	}
	return "unknown"
}

// WatchHolder is a grant as its etcd record shows it. A record that does
// not decode (it never should) leaves all but Name and Token zero.
type WatchHolder struct {
	Name       string
	Token      int64 // the create revision of the grant's key
	Owner      string
	AcquiredAt time.Time // on the clock of the owner that granted it
	TTL        time.Duration
	Limit      int32 // 0 or 1: a mutex or a read-write lock; N > 1: a semaphore of N
	Slot       int32
	Shared     bool // a read-write lock's reader
}

// WatchEvent is one change of the watched holders.
type WatchEvent struct {
	Kind WatchKind
	// Revision is etcd's revision of the change (of the read, for
	// WatchCurrent). A WatchGranted's is its token.
	Revision int64
	Holder   *WatchHolder
	// End is how the grant ended (WatchEnded), by its lock's end marker.
	End GrantEnd
}

// watchCompactedRetries bounds the snapshots of a watch from the current
// state that a compaction overtakes (each is retried at once: only a
// compactor that keeps almost no history can win that race).
const watchCompactedRetries = 5

// watchPage is how many grant keys one read of a snapshot takes.
const watchPage = 1000

// Watch calls emit with the watched grants as they change, in revision
// order, until ctx ends (ctx's error), emit fails (its error), the owner
// closes (lease.ErrShuttingDown) or etcd fails.
//
// With startRev 0 it first emits the holders at the current revision
// (WatchCurrent, oldest first per name, names in byte order), then every
// change after it. With startRev > 0 it emits every change from that
// revision on: lease.ErrCompacted if etcd compacted it away, a
// *keyspace.FieldError if it is beyond etcd's current revision. Within one
// revision the ends come first (a hand-off's release, then its grant),
// each group by name, then token.
//
// It reads etcd only (any replica serves it, relays too); etcd's
// unavailability comes back wrapping lease.ErrUnavailable.
func (o *Owner) Watch(ctx context.Context, f WatchFilter, startRev int64, emit func(WatchEvent) error) error {
	if err := f.validate(); err != nil {
		return err
	}
	if startRev < 0 {
		return keyspace.FieldErr("start_revision", "must not be negative, got %d", startRev)
	}
	w := &grantWatch{o: o, f: f, data: o.prefix + "shards/data/", state: map[string]*WatchHolder{}}
	w.key = w.data
	if f.Name != "" {
		w.key = o.dataPrefix(o.ShardOf(f.Name)) + keyspace.Escape(f.Name) + "/"
	}
	w.end = clientv3.GetPrefixRangeEnd(w.key)

	// The owner's close ends the watch too (the replica is going away).
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop := context.AfterFunc(o.ctx, func() { cancel(lease.ErrShuttingDown) })
	defer stop()
	err := w.run(ctx, startRev, emit)
	if cause := context.Cause(ctx); errors.Is(cause, lease.ErrShuttingDown) {
		return cause
	}
	return err
}

// grantWatch is one Watch: the key range it follows and the watched
// holders by key (what a delete ended, should etcd not send its previous
// value).
type grantWatch struct {
	o        *Owner
	f        WatchFilter
	data     string // <prefix>shards/data/
	key, end string // the watched range
	state    map[string]*WatchHolder
	next     int64 // the first revision not emitted yet
}

func (w *grantWatch) run(ctx context.Context, startRev int64, emit func(WatchEvent) error) error {
	if startRev == 0 {
		wch, cancel, err := w.current(ctx, emit)
		if err != nil {
			return err
		}
		defer cancel()
		return w.follow(ctx, wch, emit)
	}
	if startRev > 1 { // revision 1 is etcd's empty store: nothing to read
		kvs, err := w.read(ctx, startRev-1)
		switch {
		case errors.Is(err, rpctypes.ErrFutureRev):
			return keyspace.FieldErr("start_revision", "is beyond etcd's current revision")
		case err != nil:
			return err
		}
		w.load(kvs)
	}
	w.next = startRev
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	return w.follow(ctx, w.o.cli.Watch(wctx, w.key, clientv3.WithRange(w.end), clientv3.WithRev(startRev), clientv3.WithPrevKV()), emit)
}

// current emits the watched holders at a revision R and returns a watch
// that reports every change after R, with the cancellation of that watch.
// The watch is opened first, from the current revision (so etcd never
// compacts it: it starts in sync), and the snapshot is read at the
// revision its creation reports, which is at or after the watch's first;
// follow skips the events up to R, which the snapshot holds. A compaction
// past R before the read retries.
func (w *grantWatch) current(ctx context.Context, emit func(WatchEvent) error) (clientv3.WatchChan, context.CancelFunc, error) {
	for attempt := 1; ; attempt++ {
		wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
		wch := w.o.cli.Watch(wctx, w.key, clientv3.WithRange(w.end), clientv3.WithPrevKV(), clientv3.WithCreatedNotify())
		rev, err := w.created(ctx, wch)
		var kvs []*mvccpb.KeyValue
		if err == nil {
			kvs, err = w.read(ctx, rev)
		}
		if errors.Is(err, lease.ErrCompacted) && attempt < watchCompactedRetries {
			cancel()
			continue
		}
		if err == nil {
			w.load(kvs)
			w.next = rev + 1
			err = w.emitCurrent(rev, emit)
		}
		if err != nil {
			cancel()
			return nil, nil, err
		}
		return wch, cancel, nil
	}
}

// created waits for the watch's creation and returns the revision etcd
// reported with it.
func (w *grantWatch) created(ctx context.Context, wch clientv3.WatchChan) (int64, error) {
	select {
	case <-ctx.Done():
		return 0, ctx.Err()
	case wr, ok := <-wch:
		switch {
		case !ok:
			return 0, w.closed(ctx)
		case wr.Err() != nil:
			return 0, w.etcdErr(ctx, "watch", wr.Err())
		case !wr.Created:
			return 0, fmt.Errorf("%w: shard: the etcd watch sent %d events before its creation", lease.ErrUnavailable, len(wr.Events))
		}
		return wr.Header.Revision, nil
	}
}

// read is the watched range's keys at rev, page by page.
func (w *grantWatch) read(ctx context.Context, rev int64) ([]*mvccpb.KeyValue, error) {
	var out []*mvccpb.KeyValue
	from := w.key
	for {
		r, err := w.o.cli.Get(ctx, from, clientv3.WithRange(w.end), clientv3.WithRev(rev), clientv3.WithLimit(watchPage))
		switch {
		case errors.Is(err, rpctypes.ErrCompacted):
			return nil, lease.ErrCompacted
		case errors.Is(err, rpctypes.ErrFutureRev):
			return nil, err
		case err != nil:
			return nil, w.etcdErr(ctx, "read the grants", err)
		}
		out = append(out, r.Kvs...)
		if !r.More || len(r.Kvs) == 0 {
			return out, nil
		}
		from = string(r.Kvs[len(r.Kvs)-1].Key) + "\x00"
	}
}

// load takes the watched holders of a snapshot into state.
func (w *grantWatch) load(kvs []*mvccpb.KeyValue) {
	for _, kv := range kvs {
		if name, ok := w.nameOf(kv.Key); ok && w.f.matches(name) {
			w.state[string(kv.Key)] = holderOf(name, kv)
		}
	}
}

// emitCurrent emits the state at rev: one WatchCurrent per holder, or one
// without a holder when none is watched.
func (w *grantWatch) emitCurrent(rev int64, emit func(WatchEvent) error) error {
	hs := sortedHolders(slices.Collect(maps.Values(w.state)))
	if len(hs) == 0 {
		return emit(WatchEvent{Kind: WatchCurrent, Revision: rev})
	}
	for _, h := range hs {
		if err := emit(WatchEvent{Kind: WatchCurrent, Revision: rev, Holder: h}); err != nil {
			return err
		}
	}
	return nil
}

// follow emits the changes the watch reports from w.next on, one revision
// at a time.
func (w *grantWatch) follow(ctx context.Context, wch clientv3.WatchChan, emit func(WatchEvent) error) error {
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case wr, ok := <-wch:
			switch {
			case !ok:
				return w.closed(ctx)
			case wr.CompactRevision != 0:
				return lease.ErrCompacted
			case wr.Err() != nil:
				return w.etcdErr(ctx, "watch", wr.Err())
			}
			evs := wr.Events
			for len(evs) > 0 {
				rev := evs[0].Kv.ModRevision
				n := 1
				for n < len(evs) && evs[n].Kv.ModRevision == rev {
					n++
				}
				if rev >= w.next { // earlier: in the snapshot, or seen before etcd's client resumed the watch
					if err := w.apply(ctx, evs[:n], rev, emit); err != nil {
						return err
					}
					w.next = rev + 1
				}
				evs = evs[n:]
			}
		}
	}
}

// apply folds one revision's events into state and emits them: the ends
// (each with how it ended), then the grants, each by name and token.
func (w *grantWatch) apply(ctx context.Context, evs []*clientv3.Event, rev int64, emit func(WatchEvent) error) error {
	var ended, granted []*WatchHolder
	markers := map[*WatchHolder]string{} // the end marker key of each ended holder
	for _, ev := range evs {
		name, ok := w.nameOf(ev.Kv.Key)
		if !ok || !w.f.matches(name) {
			continue
		}
		k := string(ev.Kv.Key)
		switch {
		case ev.Type == clientv3.EventTypeDelete:
			h := w.state[k]
			if ev.PrevKv != nil {
				h = holderOf(name, ev.PrevKv)
			}
			delete(w.state, k)
			if h != nil {
				ended = append(ended, h)
				markers[h] = w.markerOf(k)
			}
		case ev.IsCreate():
			h := holderOf(name, ev.Kv)
			w.state[k] = h
			granted = append(granted, h)
		default:
			// A grant's key is written once; a rewrite is no new holder.
			w.state[k] = holderOf(name, ev.Kv)
		}
	}
	how, err := w.endsAt(ctx, rev, ended, markers)
	if err != nil {
		return err
	}
	for _, h := range sortedHolders(ended) {
		if err := emit(WatchEvent{Kind: WatchEnded, Revision: rev, Holder: h, End: how[h]}); err != nil {
			return err
		}
	}
	for _, h := range sortedHolders(granted) {
		if err := emit(WatchEvent{Kind: WatchGranted, Revision: rev, Holder: h}); err != nil {
			return err
		}
	}
	return nil
}

// endsAt is how each of the holders whose keys a revision deleted ended,
// by the end markers (markers, by holder) as written in that revision:
// one read of them all at rev.
func (w *grantWatch) endsAt(ctx context.Context, rev int64, ended []*WatchHolder, markers map[*WatchHolder]string) (map[*WatchHolder]GrantEnd, error) {
	if len(ended) == 0 {
		return nil, nil
	}
	var keys []string
	for _, h := range ended {
		if k := markers[h]; !slices.Contains(keys, k) {
			keys = append(keys, k)
		}
	}
	values, err := w.markersAt(ctx, rev, keys)
	compacted := errors.Is(err, lease.ErrCompacted) // after etcd sent the events: rare, and not fatal
	if err != nil && !compacted {
		return nil, err
	}
	how := make(map[*WatchHolder]GrantEnd, len(ended))
	for _, h := range ended {
		how[h] = GrantEndUnknown
		if !compacted {
			how[h] = grantEndOf(locktable.MarkedEnd(values[markers[h]], h.Token))
		}
	}
	return how, nil
}

// markersAt reads the end markers at keys as they were at rev, in one
// request: the value of each one written in that very revision (others
// are older ends', or none). The keys are the locks of one revision's
// deletes, so no more than the ops of the Txn that made it (etcd's
// --max-txn-ops bounds both).
func (w *grantWatch) markersAt(ctx context.Context, rev int64, keys []string) (map[string]string, error) {
	var kvs []*mvccpb.KeyValue
	if len(keys) == 1 {
		r, err := w.o.cli.Get(ctx, keys[0], clientv3.WithRev(rev))
		if err != nil {
			return nil, w.markerErr(ctx, err)
		}
		kvs = r.Kvs
	} else {
		ops := make([]clientv3.Op, len(keys))
		for i, k := range keys {
			ops[i] = clientv3.OpGet(k, clientv3.WithRev(rev))
		}
		r, err := w.o.cli.Txn(ctx).Then(ops...).Commit()
		if err != nil {
			return nil, w.markerErr(ctx, err)
		}
		for _, rr := range r.Responses {
			kvs = append(kvs, rr.GetResponseRange().GetKvs()...)
		}
	}
	out := make(map[string]string, len(kvs))
	for _, kv := range kvs {
		if kv.ModRevision == rev {
			out[string(kv.Key)] = string(kv.Value)
		}
	}
	return out, nil
}

// markerErr is the error of a read of end markers: lease.ErrCompacted if
// etcd no longer has the revision.
func (w *grantWatch) markerErr(ctx context.Context, err error) error {
	if errors.Is(err, rpctypes.ErrCompacted) {
		return lease.ErrCompacted
	}
	return w.etcdErr(ctx, "read the end markers", err)
}

// grantEndOf is an end marker's cause as a GrantEnd.
func grantEndOf(c locktable.EndCause) GrantEnd {
	switch c {
	case locktable.EndReleased:
		return GrantReleased
	case locktable.EndForced:
		return GrantForced
	}
	return GrantExpired
}

// markerOf is the end marker key of the lock of a grant key:
// <data><shard>/<escaped name>/<id> ends at <ended><shard>/<escaped name>.
func (w *grantWatch) markerOf(key string) string {
	rest := strings.TrimPrefix(key, w.data)
	return w.o.prefix + "shards/ended/" + rest[:strings.LastIndexByte(rest, '/')]
}

// endedPrefix is where a shard's end markers live (locktable.Config).
func (o *Owner) endedPrefix(shard uint32) string {
	return fmt.Sprintf("%sshards/ended/%05d/", o.prefix, shard)
}

// nameOf is the lock name of a grant key, <data><shard>/<escaped name>/<id>.
func (w *grantWatch) nameOf(key []byte) (string, bool) {
	rest, ok := strings.CutPrefix(string(key), w.data)
	if !ok {
		return "", false
	}
	_, rest, ok = strings.Cut(rest, "/") // the shard
	if !ok {
		return "", false
	}
	esc, id, ok := strings.Cut(rest, "/")
	if !ok || esc == "" || id == "" {
		return "", false
	}
	return keyspace.Unescape(esc), true
}

// closed is the error of a watch channel that closed: ctx's end, else an
// etcd client that gave up (etcd is unavailable to this replica).
func (w *grantWatch) closed(ctx context.Context) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return fmt.Errorf("%w: shard: the etcd watch of the grants closed", lease.ErrUnavailable)
}

func (w *grantWatch) etcdErr(ctx context.Context, op string, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return etcdx.Classify("shard: "+op, err)
}

// holderOf is the holder a grant's key shows.
func holderOf(name string, kv *mvccpb.KeyValue) *WatchHolder {
	h := &WatchHolder{Name: name, Token: kv.CreateRevision}
	if r, err := locktable.DecodeRecord(kv.Value); err == nil {
		h.Owner, h.AcquiredAt, h.TTL = r.Owner, time.UnixMilli(r.AcquiredMs), time.Duration(r.TTLms)*time.Millisecond
		h.Limit, h.Slot, h.Shared = r.Limit, r.Slot, r.Shared
	}
	return h
}

// sortedHolders sorts hs by name, then token (for one lock: oldest first).
func sortedHolders(hs []*WatchHolder) []*WatchHolder {
	slices.SortFunc(hs, func(a, b *WatchHolder) int {
		return cmp.Or(strings.Compare(a.Name, b.Name), cmp.Compare(a.Token, b.Token))
	})
	return hs
}
