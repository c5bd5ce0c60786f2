package coordinator

import (
	"context"
	"slices"
	"sync/atomic"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"

	"github.com/coordinatord/coordinatord/internal/epoch"
)

// witness tells the epoch keeper the revision of every unary answer the
// coordinator's etcd client gets (epoch.Keeper.Witness): the tokens granted
// and the answers given since the keeper's last check then count when the
// next check looks for a restore. It is an interceptor of the etcd client,
// set up before the keeper exists (the keeper needs the client).
type witness struct{ keeper atomic.Pointer[epoch.Keeper] }

// config is cfg with the witness's interceptor added to its dial options.
func (w *witness) config(cfg clientv3.Config) clientv3.Config {
	cfg.DialOptions = append(slices.Clip(cfg.DialOptions), grpc.WithChainUnaryInterceptor(w.intercept))
	return cfg
}

// headed is every etcd answer with a response header.
type headed interface {
	GetHeader() *etcdserverpb.ResponseHeader
}

func (w *witness) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	k := w.keeper.Load()
	if k == nil {
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	gen := k.Generation()
	err := invoker(ctx, method, req, reply, cc, opts...)
	if h, ok := reply.(headed); ok && err == nil {
		k.Witness(gen, h.GetHeader().GetRevision())
	}
	return err
}
