package etcdx

import (
	"context"

	"google.golang.org/grpc/metadata"
)

// WithOwnWatchStream returns ctx marked so that the watches started with it
// (and progress requests made with it) share a gRPC watch stream of their
// own, named name, instead of the one clientv3 multiplexes every watch of
// the client on. clientv3 groups watches by their context's outgoing
// metadata; a progress request is answered per stream, so a watcher that
// asks for progress on a private stream is not answered late, or for
// others, behind every other watch of the client.
func WithOwnWatchStream(ctx context.Context, name string) context.Context {
	return metadata.AppendToOutgoingContext(ctx, "coordinatord-watch", name)
}
