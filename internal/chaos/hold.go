package chaos

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/durationpb"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
)

// holdStreamTimeout bounds one Hold stream of the workload.
const holdStreamTimeout = 15 * time.Second

// errNotGranted: a Hold stream's first answer was not a grant.
var errNotGranted = errors.New("chaos: the first Hold answer is not a grant")

// holdRound acquires the lock on a Hold stream, writes and heartbeats on it
// a few times, and releases it on the stream. Every step is recorded like
// its unary twin: the grant as an Acquire, a heartbeat as a KeepAlive (a
// Lost answer is a definite NOT_FOUND), the release as a Release. A broken
// stream ends the round without a release: the lease ends by its TTL.
func (c *Client) holdRound(ctx context.Context) {
	work := context.WithoutCancel(ctx) // the history stays whole
	sctx, cancel := context.WithTimeout(work, holdStreamTimeout)
	defer cancel()
	op := Op{Client: c.id, Name: c.name, Kind: Acquire, Call: c.w.Rec.Now()}
	lc := c.LC()
	if c.w.HoldOn != nil {
		if i := c.w.HoldOn(c.name); i >= 0 {
			lc = c.w.Replicas[i%len(c.w.Replicas)]
		}
	}
	st, err := lc.Hold(sctx)
	if err == nil {
		err = send(st, &coordinatorv1.HoldRequest{Kind: &coordinatorv1.HoldRequest_Acquire{Acquire: &coordinatorv1.HoldAcquire{
			Request: &coordinatorv1.AcquireRequest{Name: c.name, Ttl: durationpb.New(c.w.TTL), Wait: durationpb.New(c.w.Wait),
				Owner: fmt.Sprintf("client-%d", c.id), RequestId: RequestID()},
		}}})
	}
	var m *coordinatorv1.HoldResponse
	if err == nil {
		m, err = st.Recv()
	}
	if err == nil && m.GetGranted() == nil {
		err = errNotGranted
	}
	if err != nil {
		c.record(op, reply{}, err)
		return
	}
	g := m.GetGranted()
	c.record(op, reply{token: g.GetToken(), out: OK, safeUntil: g.GetSafeUntil().AsTime()}, nil)
	tok := g.GetToken()
	for range 1 + c.rng.IntN(3) {
		if !c.Write(work, tok, false) {
			break
		}
		hb := Op{Client: c.id, Name: c.name, Kind: KeepAlive, Token: tok, Call: c.w.Rec.Now()}
		err := send(st, &coordinatorv1.HoldRequest{Kind: &coordinatorv1.HoldRequest_Heartbeat{Heartbeat: &coordinatorv1.HoldHeartbeat{}}})
		if err == nil {
			m, err = st.Recv()
		}
		switch {
		case err != nil:
			c.record(hb, reply{}, err)
			return
		case m.GetLost() != nil:
			c.record(hb, reply{out: Failed}, nil)
			return
		}
		c.record(hb, reply{out: OK, safeUntil: m.GetRenewed().GetSafeUntil().AsTime()}, nil)
		time.Sleep(time.Duration(c.rng.IntN(100)) * time.Millisecond)
	}
	rel := Op{Client: c.id, Name: c.name, Kind: Release, Token: tok, Call: c.w.Rec.Now()}
	err = send(st, &coordinatorv1.HoldRequest{Kind: &coordinatorv1.HoldRequest_Release{Release: &coordinatorv1.HoldRelease{}}})
	if err == nil {
		m, err = st.Recv()
	}
	switch {
	case err != nil:
		c.record(rel, reply{}, err)
	case m.GetReleased().GetReleased():
		c.record(rel, reply{out: OK}, nil)
	default: // released: false, or lost before the release
		c.record(rel, reply{out: Failed}, nil)
	}
	_ = st.CloseSend()
}

// send sends req on st. When the server has ended the stream, gRPC's Send
// answers io.EOF, and what the server said last (a Lost, the stream's
// status) is for the caller's next Recv to read: send then answers nil (a
// Hold ended by a change of the token epoch recorded a bare "EOF", which
// the answer checker took for UNKNOWN).
func send(st grpc.BidiStreamingClient[coordinatorv1.HoldRequest, coordinatorv1.HoldResponse], req *coordinatorv1.HoldRequest) error {
	if err := st.Send(req); !errors.Is(err, io.EOF) {
		return err
	}
	return nil
}
