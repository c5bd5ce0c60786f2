package lease

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// keepalives renews leases on demand over a few long-lived LeaseKeepAlive
// streams, instead of opening a stream per renewal as
// clientv3.KeepAliveOnce does (a stream setup costs both sides far more
// than the renewal). It never renews on its own: one request, one renewal.
// etcd answers a stream's requests one at a time, in order; each lease's
// waiters are kept in order and matched by lease ID.
type keepalives struct {
	cli *clientv3.Client
	// start runs a stream's receive loop in a goroutine the Manager owns;
	// false once the Manager is closing.
	start func(func()) bool
	ctx   context.Context // the streams live until it ends
	next  atomic.Uint32
	lanes [keepaliveStreams]kaLane
}

const keepaliveStreams = 4

type kaLane struct {
	mu      sync.Mutex
	stream  pb.Lease_LeaseKeepAliveClient
	cancel  context.CancelFunc
	pending map[int64][]chan kaResult
}

type kaResult struct {
	ttl int64
	err error
}

var errStreamClosed = errors.New("lease keepalive stream closed")

// once renews lease id once and returns its new TTL in seconds;
// rpctypes.ErrLeaseNotFound if the lease is gone.
func (k *keepalives) once(ctx context.Context, id clientv3.LeaseID) (int64, error) {
	l := &k.lanes[k.next.Add(1)%keepaliveStreams]
	for attempt := 0; ; attempt++ {
		ttl, err := k.try(ctx, l, id)
		if err == nil || ctx.Err() != nil || attempt > 0 || errors.Is(err, rpctypes.ErrLeaseNotFound) {
			if err != nil && ctx.Err() != nil {
				return 0, ctx.Err()
			}
			return ttl, err
		}
		// A broken stream (a member restarted, a leader changed): one more
		// try, on a new stream (the lane's broken one was dropped before
		// its callers heard of it), then the caller decides.
	}
}

func (k *keepalives) try(ctx context.Context, l *kaLane, id clientv3.LeaseID) (int64, error) {
	ch := make(chan kaResult, 1)
	l.mu.Lock()
	if l.stream == nil {
		if err := k.open(l); err != nil {
			l.mu.Unlock()
			return 0, err
		}
	}
	l.pending[int64(id)] = append(l.pending[int64(id)], ch)
	err := l.stream.Send(&pb.LeaseKeepAliveRequest{ID: int64(id)})
	if err != nil {
		// The receive loop sees the stream end and fails every pending
		// renewal, this one included.
		l.cancel()
	}
	l.mu.Unlock()
	select {
	case r := <-ch:
		return r.ttl, r.err
	case <-ctx.Done():
		return 0, ctx.Err() // the answer, if any, lands in ch's buffer
	}
}

// open starts a stream and its receive loop; l.mu is held.
func (k *keepalives) open(l *kaLane) error {
	ctx, cancel := context.WithCancel(clientv3.WithRequireLeader(k.ctx))
	s, err := pb.NewLeaseClient(k.cli.ActiveConnection()).LeaseKeepAlive(ctx)
	if err != nil {
		cancel()
		return rpctypes.Error(err)
	}
	if !k.start(func() { k.recv(l, s, cancel) }) {
		cancel()
		return errStreamClosed
	}
	l.stream, l.cancel, l.pending = s, cancel, map[int64][]chan kaResult{}
	return nil
}

func (k *keepalives) recv(l *kaLane, s pb.Lease_LeaseKeepAliveClient, cancel context.CancelFunc) {
	defer cancel()
	for {
		resp, err := s.Recv()
		l.mu.Lock()
		if err != nil {
			if l.stream == s {
				for _, chs := range l.pending {
					for _, ch := range chs {
						ch <- kaResult{err: rpctypes.Error(err)}
					}
				}
				l.stream, l.cancel, l.pending = nil, nil, nil
			}
			l.mu.Unlock()
			return
		}
		chs := l.pending[resp.ID]
		if len(chs) == 0 {
			l.mu.Unlock()
			continue // not asked for on this stream: ignore
		}
		if len(chs) == 1 {
			delete(l.pending, resp.ID)
		} else {
			l.pending[resp.ID] = chs[1:]
		}
		l.mu.Unlock()
		r := kaResult{ttl: resp.TTL}
		if resp.TTL <= 0 {
			r = kaResult{err: rpctypes.ErrLeaseNotFound}
		}
		chs[0] <- r
	}
}
