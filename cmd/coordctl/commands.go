package main

import (
	"context"
	cryptorand "crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
)

// optDuration is a duration flag that knows whether it was set.
type optDuration struct {
	d   time.Duration
	set bool
}

func (o *optDuration) String() string {
	if o == nil || !o.set {
		return ""
	}
	return o.d.String()
}

func (o *optDuration) Set(s string) error {
	d, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	o.d, o.set = d, true
	return nil
}

// lockFlags are the flags of acquire and exec.
type lockFlags struct {
	ttl       time.Duration
	wait      optDuration
	owner     string
	lockDelay time.Duration
	maxHold   time.Duration
}

func (l *lockFlags) register(fs *flag.FlagSet) {
	fs.DurationVar(&l.ttl, "ttl", 0, "lease TTL, whole seconds (default: the server's, 15s out of the box)")
	fs.Var(&l.wait, "wait", "how long to wait in the queue; 0s: try once (default: until Ctrl-C, at most the server's -max-wait)")
	fs.StringVar(&l.owner, "owner", defaultOwner(), "who holds the lock, shown by describe and list")
	fs.DurationVar(&l.lockDelay, "lock-delay", 0, "keep the lock from everyone for this long if this grant ends without a release (expiry, force-release)")
	fs.DurationVar(&l.maxHold, "max-hold", 0, "refuse renewals past acquisition + this (default: the server's -max-hold)")
}

func defaultOwner() string {
	host, _ := os.Hostname()
	return fmt.Sprintf("coordctl@%s pid %d", host, os.Getpid())
}

func newRequestID() string {
	var b [16]byte
	_, _ = cryptorand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// signalContext is cancelled by SIGINT or SIGTERM.
func signalContext() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
}

func parseToken(e *env, s string) (int64, int) {
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n <= 0 {
		fmt.Fprintf(e.stderr, "%s: TOKEN %q: want a positive integer\n", e.name, s)
		return 0, exitUsage
	}
	return n, -1
}

// grant is an acquired (or renewed) grant in JSON output.
type grant struct {
	Name       string     `json:"name"`
	Token      int64      `json:"token"`
	Handle     string     `json:"handle,omitempty"`
	LeaseID    int64      `json:"lease_id,omitempty"`
	TTL        string     `json:"ttl"`
	ExpiresAt  *time.Time `json:"expires_at"`
	SafeUntil  *time.Time `json:"safe_until"`
	AcquiredAt *time.Time `json:"acquired_at,omitempty"`
}

func cmdAcquire(e *env, args []string) int {
	fs := e.flagSet(e.name)
	var lf lockFlags
	lf.register(fs)
	pos, code := e.parse(fs, args, 1, 1, "NAME [--ttl D] [--wait D] [--owner S] [--lock-delay D] [--max-hold D]")
	if code >= 0 {
		return code
	}
	conn, code := e.connect()
	if code >= 0 {
		return code
	}
	defer conn.Close()
	req := &coordinatorv1.AcquireRequest{Name: pos[0], Owner: lf.owner, RequestId: newRequestID()}
	if lf.ttl != 0 {
		req.Ttl = durationpb.New(lf.ttl)
	}
	if lf.lockDelay != 0 {
		req.LockDelay = durationpb.New(lf.lockDelay)
	}
	if lf.maxHold != 0 {
		req.MaxHold = durationpb.New(lf.maxHold)
	}
	ctx, stop := signalContext()
	defer stop()
	extra := time.Duration(-1) // no wait limit: until Ctrl-C
	if lf.wait.set {
		req.Wait = durationpb.New(lf.wait.d)
		extra = max(lf.wait.d, 0)
	} else if err := e.waitReady(ctx, conn); err != nil {
		return e.fail(err)
	}
	var resp *coordinatorv1.AcquireResponse
	lc := coordinatorv1.NewLockServiceClient(conn)
	err := e.call(ctx, extra, func(ctx context.Context) error {
		var err error
		resp, err = lc.Acquire(ctx, req) // the same request id: a retry never makes a second grant
		return err
	})
	if err != nil {
		return e.fail(err)
	}
	g := grant{
		Name: pos[0], Token: resp.GetToken(), Handle: resp.GetHandle(), LeaseID: resp.GetLeaseId(),
		TTL: resp.GetTtl().AsDuration().String(), ExpiresAt: ts(resp.GetExpiresAt()),
		SafeUntil: ts(resp.GetSafeUntil()), AcquiredAt: ts(resp.GetAcquiredAt()),
	}
	if e.output == "json" {
		e.printJSON(g)
	} else {
		e.table([]string{"NAME", "TOKEN", "HANDLE", "TTL", "EXPIRES_AT", "SAFE_UNTIL"},
			[]string{g.Name, strconv.FormatInt(g.Token, 10), g.Handle, g.TTL, cell(g.ExpiresAt), cell(g.SafeUntil)})
	}
	return exitOK
}

// printReleased prints the outcome of release and force-release.
func (e *env) printReleased(name string, token int64, released bool) int {
	if e.output == "json" {
		e.printJSON(struct {
			Name     string `json:"name"`
			Token    int64  `json:"token"`
			Released bool   `json:"released"`
		}{name, token, released})
	} else {
		e.table([]string{"NAME", "TOKEN", "RELEASED"}, []string{name, strconv.FormatInt(token, 10), strconv.FormatBool(released)})
	}
	if !released {
		return exitNotValid
	}
	return exitOK
}

func cmdRelease(e *env, args []string) int {
	name, token, handle, code := e.grantArgs(args)
	if code >= 0 {
		return code
	}
	conn, code := e.connect()
	if code >= 0 {
		return code
	}
	defer conn.Close()
	var resp *coordinatorv1.ReleaseResponse
	lc := coordinatorv1.NewLockServiceClient(conn)
	err := e.call(context.Background(), 0, func(ctx context.Context) error {
		var err error
		resp, err = lc.Release(ctx, &coordinatorv1.ReleaseRequest{Name: name, Token: token, Handle: handle})
		return err
	})
	if err != nil {
		return e.fail(err)
	}
	return e.printReleased(name, token, resp.GetReleased())
}

func cmdKeepAlive(e *env, args []string) int {
	name, token, handle, code := e.grantArgs(args)
	if code >= 0 {
		return code
	}
	conn, code := e.connect()
	if code >= 0 {
		return code
	}
	defer conn.Close()
	var resp *coordinatorv1.KeepAliveResponse
	lc := coordinatorv1.NewLockServiceClient(conn)
	err := e.call(context.Background(), 0, func(ctx context.Context) error {
		var err error
		resp, err = lc.KeepAlive(ctx, &coordinatorv1.KeepAliveRequest{Name: name, Token: token, Handle: handle})
		return err
	})
	if err != nil {
		return e.fail(err)
	}
	g := grant{Name: name, Token: token, TTL: resp.GetTtl().AsDuration().String(), ExpiresAt: ts(resp.GetExpiresAt()), SafeUntil: ts(resp.GetSafeUntil())}
	if e.output == "json" {
		e.printJSON(g)
	} else {
		e.table([]string{"NAME", "TOKEN", "TTL", "EXPIRES_AT", "SAFE_UNTIL"},
			[]string{g.Name, strconv.FormatInt(token, 10), g.TTL, cell(g.ExpiresAt), cell(g.SafeUntil)})
	}
	return exitOK
}

func cmdValidate(e *env, args []string) int {
	fs := e.flagSet(e.name)
	resource := fs.String("resource", "", "protected resource: also check (and raise) its high-water mark")
	pos, code := e.parse(fs, args, 2, 2, "NAME TOKEN [--resource R]")
	if code >= 0 {
		return code
	}
	token, code := parseToken(e, pos[1])
	if code >= 0 {
		return code
	}
	conn, code := e.connect()
	if code >= 0 {
		return code
	}
	defer conn.Close()
	var resp *coordinatorv1.ValidateTokenResponse
	lc := coordinatorv1.NewLockServiceClient(conn)
	err := e.call(context.Background(), 0, func(ctx context.Context) error {
		var err error
		resp, err = lc.ValidateToken(ctx, &coordinatorv1.ValidateTokenRequest{Name: pos[0], Token: token, Resource: *resource})
		return err
	})
	if err != nil {
		return e.fail(err)
	}
	reason := enumName(resp.GetReason().String(), "REASON_")
	if e.output == "json" {
		e.printJSON(struct {
			Name         string `json:"name"`
			Token        int64  `json:"token"`
			Resource     string `json:"resource,omitempty"`
			Valid        bool   `json:"valid"`
			Reason       string `json:"reason"`
			CurrentToken int64  `json:"current_token"`
		}{pos[0], token, *resource, resp.GetValid(), reason, resp.GetCurrentToken()})
	} else {
		e.table([]string{"NAME", "TOKEN", "VALID", "REASON", "CURRENT_TOKEN"},
			[]string{pos[0], pos[1], strconv.FormatBool(resp.GetValid()), reason, strconv.FormatInt(resp.GetCurrentToken(), 10)})
	}
	if !resp.GetValid() {
		return exitNotValid
	}
	return exitOK
}

func cmdDescribe(e *env, args []string) int {
	fs := e.flagSet(e.name)
	pos, code := e.parse(fs, args, 1, 1, "NAME")
	if code >= 0 {
		return code
	}
	conn, code := e.connect()
	if code >= 0 {
		return code
	}
	defer conn.Close()
	var resp *coordinatorv1.DescribeResponse
	lc := coordinatorv1.NewLockServiceClient(conn)
	err := e.call(context.Background(), 0, func(ctx context.Context) error {
		var err error
		resp, err = lc.Describe(ctx, &coordinatorv1.DescribeRequest{Name: pos[0]})
		return err
	})
	if err != nil {
		return e.fail(err)
	}
	type waiter struct {
		Owner        string     `json:"owner"`
		WaitingSince *time.Time `json:"waiting_since"`
	}
	out := struct {
		Name    string   `json:"name"`
		Held    bool     `json:"held"`
		Holder  *holder  `json:"holder"`
		Waiters []waiter `json:"waiters"`
	}{Name: pos[0], Holder: toHolder(resp.GetHolder()), Waiters: []waiter{}}
	out.Held = out.Holder != nil
	for _, w := range resp.GetWaiters() {
		out.Waiters = append(out.Waiters, waiter{Owner: w.GetOwner(), WaitingSince: ts(w.GetWaitingSince())})
	}
	if e.output == "json" {
		e.printJSON(out)
		return exitOK
	}
	rows := [][]string{{"NAME", "STATE", "TOKEN", "OWNER", "SINCE", "EXPIRES_AT"}}
	if h := out.Holder; h != nil {
		rows = append(rows, []string{h.Name, "held", strconv.FormatInt(h.Token, 10), dash(h.Owner), cell(h.AcquiredAt), cell(h.ExpiresAt)})
	} else {
		rows = append(rows, []string{pos[0], "free", "-", "-", "-", "-"})
	}
	for i, w := range out.Waiters {
		rows = append(rows, []string{pos[0], fmt.Sprintf("waiting #%d", i+1), "-", dash(w.Owner), cell(w.WaitingSince), "-"})
	}
	e.table(rows...)
	return exitOK
}

func cmdList(e *env, args []string) int {
	fs := e.flagSet(e.name)
	pos, code := e.parse(fs, args, 0, 1, "[PREFIX]")
	if code >= 0 {
		return code
	}
	prefix := ""
	if len(pos) == 1 {
		prefix = pos[0]
	}
	conn, code := e.connect()
	if code >= 0 {
		return code
	}
	defer conn.Close()
	holders, err := e.listHolders(conn, prefix)
	if err != nil {
		return e.fail(err)
	}
	if e.output == "json" {
		e.printJSON(struct {
			Holders []*holder `json:"holders"`
		}{holders})
		return exitOK
	}
	rows := [][]string{{"NAME", "TOKEN", "OWNER", "ACQUIRED_AT"}}
	for _, h := range holders {
		rows = append(rows, []string{h.Name, strconv.FormatInt(h.Token, 10), dash(h.Owner), cell(h.AcquiredAt)})
	}
	e.table(rows...)
	return exitOK
}

// listHolders returns the held locks whose names start with prefix, every
// page of them.
func (e *env) listHolders(conn grpc.ClientConnInterface, prefix string) ([]*holder, error) {
	lc := coordinatorv1.NewLockServiceClient(conn)
	holders := []*holder{}
	page := ""
	for {
		var resp *coordinatorv1.ListResponse
		err := e.call(context.Background(), 0, func(ctx context.Context) error {
			var err error
			resp, err = lc.List(ctx, &coordinatorv1.ListRequest{Prefix: prefix, PageSize: 1000, PageToken: page})
			return err
		})
		if err != nil {
			return nil, err
		}
		for _, h := range resp.GetHolders() {
			holders = append(holders, toHolder(h))
		}
		if page = resp.GetNextPageToken(); page == "" {
			return holders, nil
		}
	}
}

func cmdWatch(e *env, args []string) int {
	fs := e.flagSet(e.name)
	count := fs.Int("count", 0, "stop after this many events, the current state included (0: until Ctrl-C)")
	from := fs.Int64("start-revision", 0, "resume from this revision (the last one seen + 1); 0: start with the current state")
	pos, code := e.parse(fs, args, 1, 1, "NAME [--count N] [--start-revision REV]")
	if code >= 0 {
		return code
	}
	conn, code := e.connect()
	if code >= 0 {
		return code
	}
	defer conn.Close()
	ctx, stop := signalContext()
	defer stop()
	stream, err := coordinatorv1.NewLockServiceClient(conn).Watch(ctx, &coordinatorv1.WatchRequest{Name: pos[0], StartRevision: *from})
	if err != nil {
		return e.fail(err)
	}
	if e.output == "table" {
		fmt.Fprintf(e.stdout, "%-10s  %-15s  %-10s  %s\n", "REVISION", "EVENT", "TOKEN", "OWNER")
	}
	for n := 0; *count == 0 || n < *count; n++ {
		ev, err := stream.Recv()
		if err != nil {
			if ctx.Err() != nil { // Ctrl-C
				return exitOK
			}
			if errors.Is(err, io.EOF) {
				err = status.Error(codes.Unavailable, "the watch stream ended: the coordinator is shutting down; watch again with --start-revision")
			}
			return e.fail(err)
		}
		kind := enumName(ev.GetKind().String(), "KIND_")
		if kind == "force_released" {
			kind = "force-released"
		}
		h := toHolder(ev.GetHolder())
		if e.output == "json" {
			e.printJSON(struct {
				Name     string  `json:"name"`
				Revision int64   `json:"revision"`
				Event    string  `json:"event"`
				Holder   *holder `json:"holder"`
			}{pos[0], ev.GetRevision(), kind, h})
			continue
		}
		token, owner := "-", "-"
		if h != nil {
			token, owner = strconv.FormatInt(h.Token, 10), dash(h.Owner)
		}
		fmt.Fprintf(e.stdout, "%-10d  %-15s  %-10s  %s\n", ev.GetRevision(), field(kind), token, field(owner))
	}
	return exitOK
}

func cmdForceRelease(e *env, args []string) int {
	fs := e.flagSet(e.name)
	pos, code := e.parse(fs, args, 2, 2, "NAME TOKEN")
	if code >= 0 {
		return code
	}
	token, code := parseToken(e, pos[1])
	if code >= 0 {
		return code
	}
	conn, code := e.connect()
	if code >= 0 {
		return code
	}
	defer conn.Close()
	var resp *coordinatorv1.ForceReleaseResponse
	lc := coordinatorv1.NewLockServiceClient(conn)
	err := e.call(context.Background(), 0, func(ctx context.Context) error {
		var err error
		resp, err = lc.ForceRelease(ctx, &coordinatorv1.ForceReleaseRequest{Name: pos[0], Token: token})
		return err
	})
	if err != nil {
		return e.fail(err)
	}
	return e.printReleased(pos[0], token, resp.GetReleased())
}
