package lease

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/coordinatord/coordinatord/internal/keyspace"
)

// ErrCompacted: the requested start revision is no longer in etcd's history.
var ErrCompacted = errors.New("lease: start revision compacted away; start again from the current state (start_revision 0)")

// errWatchClosed: an etcd watch channel closed without an error of the
// caller's (the etcd client shut down or gave up on its connection): etcd
// is unavailable to this replica, a retry elsewhere is safe.
var errWatchClosed = fmt.Errorf("%w: the etcd watch closed", ErrUnavailable)

// EndReason is how a grant ended.
type EndReason int

// End reasons.
const (
	EndExpired  EndReason = iota + 1 // lease ran out (or withdrawn unmarked)
	EndReleased                      // clean release with the handle
	EndForced                        // ForceRelease
)

// AwaitEnd blocks until the grant (name, token, handle) ends and says how.
// It returns at once with EndExpired if the grant is already gone.
func (m *Manager) AwaitEnd(ctx context.Context, name string, token int64, handle string) (EndReason, error) {
	id, _, err := parseHandle(handle)
	if err != nil {
		return 0, err
	}
	key := m.ks.key(name, id)
	for {
		wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
		reason, err := m.awaitEnd(wctx, name, key, token)
		cancel()
		if errors.Is(err, errRewatch) {
			continue
		}
		return reason, err
	}
}

var errRewatch = errors.New("watch broke")

func (m *Manager) awaitEnd(ctx context.Context, name, key string, token int64) (EndReason, error) {
	wch := m.cli.Watch(ctx, key, clientv3.WithCreatedNotify(), clientv3.WithFilterPut())
	for {
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case wr, ok := <-wch:
			if !ok || wr.Canceled {
				if ctx.Err() != nil {
					return 0, ctx.Err()
				}
				return 0, errRewatch
			}
			if wr.Created {
				r, err := m.cli.Get(ctx, key)
				if err != nil {
					return 0, m.etcdErr(ctx, "read grant", err)
				}
				if len(r.Kvs) == 0 || r.Kvs[0].CreateRevision != token {
					// Already gone: its end marker, if it is still the
					// latest of this lock, says how.
					return m.endedAlready(context.WithoutCancel(ctx), name, token), nil
				}
			}
			for _, ev := range wr.Events {
				if ev.Type == clientv3.EventTypeDelete {
					return m.endAt(context.WithoutCancel(ctx), name, token, ev.Kv.ModRevision), nil
				}
			}
		}
	}
}

// EventKind is a kind of Watch event.
type EventKind int

// Watch event kinds.
const (
	EventCurrent EventKind = iota + 1
	EventAcquired
	EventReleased
	EventExpired
	EventForceReleased
)

// Event is one change of a lock's holder.
type Event struct {
	Kind     EventKind
	Revision int64
	Holder   *Holder // nil for EventCurrent on a free lock
}

// Watch calls emit with the lock's current holder (EventCurrent), then with
// every change of holder in revision order, until ctx ends or emit fails.
// With startRev > 0 it skips the current state and replays every change
// from that revision on (ErrCompacted if etcd no longer has it).
func (m *Manager) Watch(ctx context.Context, name string, startRev int64, emit func(Event) error) error {
	if err := ValidateName("name", name, false); err != nil {
		return err
	}
	if startRev < 0 {
		return fieldErr("start_revision", "must not be negative, got %d", startRev)
	}
	queue := m.ks.Queue(name)
	r, err := m.readQueue(ctx, queue, startRev)
	if err != nil {
		return err
	}
	state := map[string]*mvccpb.KeyValue{}
	for _, kv := range r.Kvs {
		state[string(kv.Key)] = kv
	}
	from := startRev
	if startRev == 0 {
		from = r.Header.Revision + 1
		if err := emitCurrent(name, r.Header.Revision, state, emit); err != nil {
			return err
		}
	}
	return m.follow(ctx, name, queue, from, state, emit)
}

// emitCurrent emits the state at rev: one EventCurrent per holder, oldest
// first, or one without a holder when the lock is free.
func emitCurrent(name string, rev int64, state map[string]*mvccpb.KeyValue, emit func(Event) error) error {
	hs := holders(state)
	if len(hs) == 0 {
		return emit(Event{Kind: EventCurrent, Revision: rev})
	}
	for _, kv := range hs {
		if err := emit(Event{Kind: EventCurrent, Revision: rev, Holder: holderOf(name, kv)}); err != nil {
			return err
		}
	}
	return nil
}

// readQueue reads the queue as it was just before startRev (startRev 0:
// as it is now).
func (m *Manager) readQueue(ctx context.Context, queue string, startRev int64) (*clientv3.GetResponse, error) {
	opts := []clientv3.OpOption{clientv3.WithPrefix()}
	if startRev > 0 {
		opts = append(opts, clientv3.WithRev(startRev-1))
	}
	r, err := m.cli.Get(ctx, queue, opts...)
	if err != nil {
		if errors.Is(err, rpctypes.ErrCompacted) || errors.Is(err, rpctypes.ErrFutureRev) {
			if errors.Is(err, rpctypes.ErrFutureRev) {
				return nil, fieldErr("start_revision", "is beyond etcd's current revision")
			}
			return nil, ErrCompacted
		}
		return nil, m.etcdErr(ctx, "read queue", err)
	}
	return r, nil
}

// follow emits every change of holder from revision from on, applying the
// queue's events to state one revision at a time.
func (m *Manager) follow(ctx context.Context, name, queue string, from int64, state map[string]*mvccpb.KeyValue, emit func(Event) error) error {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	wch := m.cli.Watch(wctx, queue, clientv3.WithPrefix(), clientv3.WithRev(from), clientv3.WithPrevKV())
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case wr, ok := <-wch:
			if !ok {
				return m.etcdErr(ctx, "watch", errWatchClosed)
			}
			if wr.CompactRevision != 0 {
				return ErrCompacted
			}
			if err := wr.Err(); err != nil {
				return m.etcdErr(ctx, "watch", err)
			}
			evs := wr.Events
			for len(evs) > 0 {
				rev := evs[0].Kv.ModRevision
				n := 1
				for n < len(evs) && evs[n].Kv.ModRevision == rev {
					n++
				}
				if err := m.apply(ctx, name, state, evs[:n], rev, emit); err != nil {
					return err
				}
				evs = evs[n:]
			}
		}
	}
}

// apply folds one revision's events into state and emits the changes of
// holders: an end for each holder that is one no more (oldest first), then
// an acquisition for each new one.
func (m *Manager) apply(ctx context.Context, name string, state map[string]*mvccpb.KeyValue, evs []*clientv3.Event, rev int64, emit func(Event) error) error {
	before := holders(state)
	ended := map[int64]*mvccpb.KeyValue{} // the last value of a deleted holder's key
	for _, ev := range evs {
		k := string(ev.Kv.Key)
		if ev.Type == clientv3.EventTypeDelete {
			if old, ok := state[k]; ok {
				ended[old.CreateRevision] = old
				if ev.PrevKv != nil {
					ended[old.CreateRevision] = ev.PrevKv
				}
			}
			delete(state, k)
			continue
		}
		state[k] = ev.Kv
	}
	after := holders(state)
	for _, b := range before {
		if slices.ContainsFunc(after, func(kv *mvccpb.KeyValue) bool { return kv.CreateRevision == b.CreateRevision }) {
			continue
		}
		last := b
		if kv, ok := ended[b.CreateRevision]; ok {
			last = kv
		}
		kind := map[EndReason]EventKind{EndExpired: EventExpired, EndReleased: EventReleased, EndForced: EventForceReleased}[m.endAt(ctx, name, b.CreateRevision, rev)]
		if err := emit(Event{Kind: kind, Revision: rev, Holder: holderOf(name, last)}); err != nil {
			return err
		}
	}
	for _, a := range after {
		if slices.ContainsFunc(before, func(kv *mvccpb.KeyValue) bool { return kv.CreateRevision == a.CreateRevision }) {
			continue
		}
		if err := emit(Event{Kind: EventAcquired, Revision: rev, Holder: holderOf(name, a)}); err != nil {
			return err
		}
	}
	return nil
}

// holders are the holders' entries in state, oldest first (admission.go).
func holders(state map[string]*mvccpb.KeyValue) []*mvccpb.KeyValue {
	kvs := slices.Collect(maps.Values(state))
	slices.SortFunc(kvs, func(a, b *mvccpb.KeyValue) int { return cmp.Compare(a.CreateRevision, b.CreateRevision) })
	return kvs[:keyspace.Holders(shapesOf(kvs))]
}

func holderOf(name string, kv *mvccpb.KeyValue) *Holder {
	if kv == nil {
		return nil
	}
	h := holderOfRecord(name, kv.CreateRevision, decodeRecord(kv.Value))
	h.AcquiredAt = time.Time{}
	return &h
}

// Resume confirms a live grant for a new Hold stream and renews it.
// ErrSessionForbidden if the grant is held through another identity's
// session.
func (m *Manager) Resume(ctx context.Context, name string, token int64, handle string, opts ...CallOption) (*Grant, error) {
	h, err := m.lookup(ctx, name, token, handle, callOptionsOf(opts).caller)
	if err != nil {
		return nil, err
	}
	r, err := m.KeepAlive(ctx, name, token, handle, opts...)
	if err != nil {
		return nil, err
	}
	return &Grant{Name: name, Token: token, Handle: handle, LeaseID: int64(h.id), TTL: r.TTL,
		ExpiresAt: r.ExpiresAt, SafeUntil: r.SafeUntil, AcquiredAt: unixTime(h.rec.Acquired), Resumed: true,
		Slot: h.rec.Slot, Shared: h.rec.Shared}, nil
}
