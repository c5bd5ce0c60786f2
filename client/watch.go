package client

import (
	"context"
	"errors"
	"io"
	"strconv"

	"google.golang.org/grpc"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
)

// ErrWatchEnded: the coordinator ended a watch stream (it is shutting
// down). Watch again, from the last revision seen + 1.
var ErrWatchEnded = errors.New("client: the watch stream ended: the coordinator is shutting down; watch again from the next revision")

// EventKind says what a WatchEvent reports.
type EventKind int32

// The kinds of WatchEvent, with the values of the API's WatchResponse.Kind.
const (
	EventUnspecified   EventKind = 0
	EventCurrent       EventKind = 1 // the state when the watch started; Holder nil: free
	EventAcquired      EventKind = 2 // a new holder was granted
	EventReleased      EventKind = 3 // the holder released the lock
	EventExpired       EventKind = 4 // the holder's lease expired
	EventForceReleased EventKind = 5 // an operator force-released the holder
)

// String is the kind as coordctl shows it: current, acquired, released,
// expired, force-released (unspecified, or the number of a kind this SDK
// does not know).
func (k EventKind) String() string {
	switch k {
	case EventUnspecified:
		return "unspecified"
	case EventCurrent:
		return "current"
	case EventAcquired:
		return "acquired"
	case EventReleased:
		return "released"
	case EventExpired:
		return "expired"
	case EventForceReleased:
		return "force-released"
	}
	return strconv.Itoa(int(k))
}

// WatchEvent is one change of a lock's state.
type WatchEvent struct {
	Kind EventKind
	// Revision is the revision of the change (of the read, for
	// EventCurrent): etcd's, in the token epoch like a token, so it only
	// goes up, across restores of etcd too. Pass the last one seen + 1 to
	// WithStartRevision to resume without a gap or a duplicate.
	Revision int64
	// Holder is the new holder (EventAcquired, EventCurrent; nil when free)
	// or the one whose grant ended; its times are zero.
	Holder *Holder
}

// WatchOption configures a Watch.
type WatchOption func(*watchOptions)

type watchOptions struct{ startRevision int64 }

// WithStartRevision resumes a watch from revision rev (the last revision
// seen + 1) instead of starting with the current state. History the
// coordinator has compacted, or that a restore of etcd from a backup
// replaced (reason EPOCH_CHANGED), answers OUT_OF_RANGE: watch again from
// the current state.
func WithStartRevision(rev int64) WatchOption {
	return func(o *watchOptions) { o.startRevision = rev }
}

// Watcher is an open watch of one lock. It is not safe for concurrent use.
type Watcher struct {
	stream grpc.ServerStreamingClient[coordinatorv1.WatchResponse]
	cancel context.CancelFunc
}

// Watch opens a watch of the lock name: Next returns its current state,
// then every change in order. The watch lasts until ctx ends or Close. It
// does not retry: after an error, watch again WithStartRevision.
func (c *Client) Watch(ctx context.Context, name string, opts ...WatchOption) (*Watcher, error) {
	o := watchOptions{}
	for _, opt := range opts {
		opt(&o)
	}
	req := &coordinatorv1.WatchRequest{Name: name, StartRevision: o.startRevision}
	ctx, cancel := context.WithCancel(ctx)
	stream, err := c.lc.Watch(ctx, req)
	if err != nil {
		cancel()
		return nil, err
	}
	return &Watcher{stream: stream, cancel: cancel}, nil
}

// Next waits for the next event. Its errors are gRPC status errors (ctx's
// end as CANCELED or DEADLINE_EXCEEDED, OUT_OF_RANGE for compacted or
// restored history, ...), or ErrWatchEnded when the coordinator ended the stream;
// the watch is over after any of them.
func (w *Watcher) Next() (WatchEvent, error) {
	ev, err := w.stream.Recv()
	if errors.Is(err, io.EOF) {
		return WatchEvent{}, ErrWatchEnded
	}
	if err != nil {
		return WatchEvent{}, err
	}
	return WatchEvent{Kind: EventKind(ev.GetKind()), Revision: ev.GetRevision(), Holder: holderOf(ev.GetHolder())}, nil
}

// Close ends the watch and frees its stream.
func (w *Watcher) Close() { w.cancel() }
