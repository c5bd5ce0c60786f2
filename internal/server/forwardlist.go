package server

// List on the shard core across members: the local shards, then each
// other shard from one member that owns it, merged and sorted.

import (
	"context"
	"maps"
	"slices"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
	"github.com/coordinatord/coordinatord/internal/shard"
)

// listAcross is List on the shard core: the holders of the shards served
// here (local), and those of every other shard from its owner, each shard
// from one member only, sorted by name and token. A forwarded List with
// "coordinatord-list-local" answers the local part alone and names its
// shards in the response header; another forwarded List answers only if
// this replica serves every shard.
func (s *LockService) listAcross(ctx context.Context, req *coordinatorv1.ListRequest, local func() ([]*coordinatorv1.Holder, []uint32)) ([]*coordinatorv1.Holder, error) {
	count := s.shards.Ownership().ShardCount()
	if forwarded(ctx) {
		hs, served := local()
		if len(metadata.ValueFromIncomingContext(ctx, mdListLocal)) > 0 {
			_ = grpc.SetHeader(ctx, metadata.Pairs(mdListShards, string(shardBitmap(served, count))))
			return hs, nil
		}
		if ns := s.uncovered(shardSet(served, count), nil); ns != nil {
			return nil, ns
		}
		return hs, nil
	}
	var octx context.Context
	if s.fwd != nil {
		octx, _ = s.fwd.outgoing(ctx)
	}
	for attempt := 0; ; attempt++ {
		hs, served := local()
		covered := shardSet(served, count)
		peers := s.peersFor(covered)
		if octx != nil && s.uncovered(covered, peers) == nil {
			more, err := s.fwd.listFrom(octx, req, slices.Sorted(maps.Keys(peers)), covered)
			if err != nil {
				return nil, err
			}
			hs = append(hs, more...)
		}
		if s.uncovered(covered, nil) == nil {
			slices.SortStableFunc(hs, func(a, b *coordinatorv1.Holder) int {
				return shard.ListOrder(a.GetName(), a.GetToken(), b.GetName(), b.GetToken())
			})
			return hs, nil
		}
		if s.fwd == nil || !s.fwd.wait(ctx, attempt) {
			return nil, s.uncovered(covered, nil)
		}
	}
}

// peersFor are the addresses of the members that own the shards not
// covered, in this replica's view (never itself).
func (s *LockService) peersFor(covered []bool) map[string]bool {
	peers := map[string]bool{}
	own := s.shards.Ownership()
	for n, ok := range covered {
		if ok {
			continue
		}
		if _, addr, known := own.Owner(uint32(n)); known && addr != "" && (s.fwd == nil || addr != s.fwd.self) {
			peers[addr] = true
		}
	}
	return peers
}

// uncovered is the NotServingError of the first shard neither covered nor
// owned by one of peers (nil peers: the first shard not covered), nil if
// there is none.
func (s *LockService) uncovered(covered []bool, peers map[string]bool) *shard.NotServingError {
	for n, ok := range covered {
		if ok {
			continue
		}
		id, addr, _ := s.shards.Ownership().Owner(uint32(n))
		if peers != nil && addr != "" && peers[addr] {
			continue
		}
		return &shard.NotServingError{Shard: uint32(n), Owner: id, Addr: addr,
			Reason: "List needs every shard, and this one is not served here nor answered for by its owner now"}
	}
	return nil
}

// listFrom asks each peer (in parallel) for the holders of the shards it
// serves, and keeps those of the shards not covered yet, each shard from
// the first peer (in the order given) that answered for it; covered grows
// by them. A peer that is unreachable or serves nothing adds nothing; any
// other failure of a peer is the answer, unchanged.
func (f *Forwarder) listFrom(ctx context.Context, req *coordinatorv1.ListRequest, addrs []string, covered []bool) ([]*coordinatorv1.Holder, error) {
	type answer struct {
		resp   *coordinatorv1.ListResponse
		shards []bool
		err    error
	}
	answers := make([]answer, len(addrs))
	lctx := metadata.AppendToOutgoingContext(ctx, mdListLocal, "1")
	var wg sync.WaitGroup
	for i, addr := range addrs {
		wg.Go(func() {
			peer, err := f.client(addr)
			if err != nil {
				answers[i].err = err
				return
			}
			var header metadata.MD
			answers[i].resp, answers[i].err = peer.List(lctx, req, grpc.Header(&header))
			var bitmap []byte
			if v := header.Get(mdListShards); len(v) == 1 {
				bitmap = []byte(v[0])
			}
			answers[i].shards = shardsOfBitmap(bitmap, len(covered))
		})
	}
	wg.Wait()
	var out []*coordinatorv1.Holder
	count := len(covered)
	for i, a := range answers {
		if a.err != nil {
			if notServedThere(a.err) {
				f.log.DebugContext(ctx, "forward: a member did not answer List; re-reading the owners", "addr", addrs[i], "err", a.err)
				continue
			}
			return nil, &forwardedError{st: a.err}
		}
		fresh := make([]bool, count)
		for n, theirs := range a.shards {
			fresh[n] = theirs && !covered[n]
		}
		for _, h := range a.resp.GetHolders() {
			if fresh[shard.ShardOf(h.GetName(), count)] {
				out = append(out, h)
			}
		}
		for n, ok := range fresh {
			covered[n] = covered[n] || ok
		}
	}
	return out, nil
}

// shardSet is the shards as a set of count.
func shardSet(shards []uint32, count int) []bool {
	set := make([]bool, count)
	for _, n := range shards {
		if int(n) < count {
			set[n] = true
		}
	}
	return set
}

// shardBitmap is the shards as a bitmap: shard n is bit n%8 of byte n/8.
func shardBitmap(shards []uint32, count int) []byte {
	b := make([]byte, (count+7)/8)
	for _, n := range shards {
		if int(n) < count {
			b[n/8] |= 1 << (n % 8)
		}
	}
	return b
}

// shardsOfBitmap is shardBitmap's bitmap as a set of count.
func shardsOfBitmap(b []byte, count int) []bool {
	set := make([]bool, count)
	for n := range set {
		set[n] = n/8 < len(b) && b[n/8]&(1<<(n%8)) != 0
	}
	return set
}
