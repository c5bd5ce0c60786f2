package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/types/known/durationpb"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
)

// The counter scenario: workers hit fixed-window counters (one hot counter,
// or many distinct ones), every hit allowed (the limit is out of reach, so
// every system writes every hit). The peers run the same fixed window:
//
//   - Redis (Debian's redis-server, started here when it is installed),
//     one connection per worker, the INCR-then-PEXPIRE-on-creation script
//     (EVALSHA), with appendfsync always (durable: the fair peer) and
//     appendfsync no;
//   - a naive etcd client: one compare-and-swap Txn per hit on the
//     counter's key (Else: read it back and try again).
const scCounter = "counter"

// Names of the counter systems.
const (
	sysRedisAlways = "Redis appendfsync always"
	sysRedisNo     = "Redis appendfsync no"
	sysNaiveTxn    = "etcd naive Txn per hit"
)

const (
	counterLimit  = 1 << 50   // never reached: every hit writes
	counterWindow = time.Hour // never ends within a run
)

// counterScript is the Redis fixed window: refuse without counting at the
// limit, else INCR, and set the expiry in the same script when the INCR
// created the key.
const counterScript = `local c = tonumber(redis.call('GET', KEYS[1]) or '0')
if c >= tonumber(ARGV[2]) then return 0 end
c = redis.call('INCR', KEYS[1])
if c == 1 then redis.call('PEXPIRE', KEYS[1], ARGV[1]) end
return c`

// counter measures one cell of the scenario: c.held is the number of
// distinct counters, which the workers hit in turn.
func (b *bench) counter(c cell, rep int) result {
	id := b.seq.Add(1)
	next := make([]int, c.clients)
	name := func(w int) string {
		k := (w + next[w]*c.clients) % c.held
		next[w]++
		return fmt.Sprintf("k%d/%d", id, k)
	}
	var fn op
	switch c.system {
	case sysCoord:
		fn = func(ctx context.Context, w int) (time.Duration, bool, error) {
			cc := b.cl.counters[w%len(b.cl.counters)]
			t := time.Now()
			r, err := cc.Hit(ctx, &coordinatorv1.HitRequest{Name: name(w), Limit: counterLimit, Window: durationpb.New(counterWindow)})
			if err == nil && !r.GetAllowed() {
				err = errors.New("hit refused")
			}
			return time.Since(t), true, err
		}
	case sysNaiveTxn:
		fn = func(ctx context.Context, w int) (time.Duration, bool, error) {
			t := time.Now()
			err := naiveHit(ctx, b.cl.etcd[w%len(b.cl.etcd)], "naive/"+name(w))
			return time.Since(t), true, err
		}
	default:
		fn = func(ctx context.Context, w int) (time.Duration, bool, error) {
			t := time.Now()
			n, err := b.redis.conns[w].evalsha(b.redis.sha, name(w), counterWindow.Milliseconds(), counterLimit)
			if err == nil && n == 0 {
				err = errors.New("hit refused")
			}
			return time.Since(t), true, err
		}
	}
	return b.window(c, rep, c.clients, 5*time.Second, "", fn)
}

// naiveHit is a hit as a plain etcd client would do it: read-modify-write
// by compare-and-swap on the key's mod revision, one Txn per attempt.
func naiveHit(ctx context.Context, cli *clientv3.Client, key string) error {
	var rev, n int64
	for {
		r, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(key), "=", rev)).
			Then(clientv3.OpPut(key, strconv.FormatInt(n+1, 10))).Else(clientv3.OpGet(key)).Commit()
		if err != nil || r.Succeeded {
			return err
		}
		kvs := r.Responses[0].GetResponseRange().GetKvs()
		rev, n = 0, 0
		if len(kvs) > 0 {
			rev = kvs[0].ModRevision
			n, _ = strconv.ParseInt(string(kvs[0].Value), 10, 64)
		}
	}
}

// redisPeer is a redis-server child and one connection per worker.
type redisPeer struct {
	cmd   *exec.Cmd
	conns []*respConn
	sha   string
}

// startRedis starts redis-server (append-only file in dir, no snapshots)
// and connects workers clients; (nil, nil) when it is not installed.
func startRedis(dir string, workers int) (*redisPeer, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, nil
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	port := lis.Addr().(*net.TCPAddr).Port
	lis.Close()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	p := &redisPeer{cmd: exec.Command(bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--dir", dir, "--save", "",
		"--appendonly", "yes", "--appendfsync", "always", "--protected-mode", "no")}
	p.cmd.Stdout, p.cmd.Stderr = nil, nil
	if err := p.cmd.Start(); err != nil {
		return nil, err
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		c, err := dialResp(addr)
		if err == nil {
			p.conns = append(p.conns, c)
			break
		}
		if time.Now().After(deadline) {
			p.stop()
			return nil, fmt.Errorf("redis-server on %s: %w", addr, err)
		}
	}
	for len(p.conns) < workers {
		c, err := dialResp(addr)
		if err != nil {
			p.stop()
			return nil, err
		}
		p.conns = append(p.conns, c)
	}
	sha, err := p.conns[0].do("SCRIPT", "LOAD", counterScript)
	if err != nil {
		p.stop()
		return nil, err
	}
	p.sha = sha
	return p, nil
}

// fsync sets appendfsync ("always" or "no").
func (p *redisPeer) fsync(mode string) error {
	_, err := p.conns[0].do("CONFIG", "SET", "appendfsync", mode)
	return err
}

func (p *redisPeer) stop() {
	for _, c := range p.conns {
		c.c.Close()
	}
	_ = p.cmd.Process.Kill()
	_ = p.cmd.Wait()
}

// respConn is a minimal RESP2 client: one request at a time.
type respConn struct {
	c net.Conn
	r *bufio.Reader
}

func dialResp(addr string) (*respConn, error) {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return nil, err
	}
	return &respConn{c: c, r: bufio.NewReader(c)}, nil
}

// do sends a command and returns a simple, integer or bulk reply as text.
func (c *respConn) do(args ...string) (string, error) {
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := c.c.Write([]byte(b.String())); err != nil {
		return "", err
	}
	line, err := c.r.ReadString('\n')
	if err != nil {
		return "", err
	}
	line = strings.TrimSuffix(line, "\r\n")
	switch {
	case line == "":
		return "", errors.New("redis: empty reply")
	case line[0] == '-':
		return "", errors.New("redis: " + line[1:])
	case line[0] == '$':
		n, _ := strconv.Atoi(line[1:])
		if n < 0 {
			return "", nil
		}
		buf := make([]byte, n+2)
		if _, err := readFull(c.r, buf); err != nil {
			return "", err
		}
		return string(buf[:n]), nil
	}
	return line[1:], nil
}

func readFull(r *bufio.Reader, buf []byte) (int, error) {
	n := 0
	for n < len(buf) {
		m, err := r.Read(buf[n:])
		n += m
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

func (c *respConn) evalsha(sha, key string, windowMS int64, limit int64) (int64, error) {
	s, err := c.do("EVALSHA", sha, "1", key, strconv.FormatInt(windowMS, 10), strconv.FormatInt(limit, 10))
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(s, 10, 64)
}

// runCounters runs the counter scenario's cells: for each number of
// distinct counters, every system, repetitions interleaved.
func (b *bench) runCounters(progress func(result), rotate func([]string, int) []string) error {
	systems := []string{sysCoord, sysNaiveTxn}
	if b.redis == nil {
		b.notes = append(b.notes, "Redis skipped: redis-server is not installed (Debian: apt-get install redis-server)")
	} else {
		systems = append(systems, sysRedisAlways, sysRedisNo)
	}
	for _, k := range b.cfg.counters {
		for r := range b.cfg.reps {
			for _, s := range rotate(systems, r) {
				switch s {
				case sysRedisAlways:
					if err := b.redis.fsync("always"); err != nil {
						return err
					}
				case sysRedisNo:
					if err := b.redis.fsync("no"); err != nil {
						return err
					}
				}
				progress(b.counter(cell{scenario: scCounter, clients: b.cfg.counterClients, held: k, system: s}, r))
			}
		}
	}
	return nil
}

// redisDir is where the Redis peer keeps its append-only file.
func redisDir(dataDir string) string { return filepath.Join(dataDir, "redis") }

// counterMarkdown is the counter scenario's table and its targets:
// coordinatord at least 0.5x Redis with appendfsync always and at
// least 10x the naive etcd Txn, for one hot counter and for many.
func (rp *report) counterMarkdown() string {
	if !rp.cfg.has(scCounter) {
		return ""
	}
	var b strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	w("### Counters\n\n%d workers hit fixed-window counters, every hit allowed and written; Redis runs the same fixed window as one script (INCR, then PEXPIRE when the INCR created the key), one connection per worker; the naive etcd client does one compare-and-swap Txn per hit. Redis's CPU shows under \"other\" in the CPU table.\n\n", rp.cfg.counterClients)
	for _, n := range rp.notes {
		w("- %s\n", n)
	}
	if len(rp.notes) > 0 {
		w("\n")
	}
	w("| counters | system | hits/s | p50 | p99 | errors |\n|---|---|---|---|---|---|\n")
	for _, k := range rp.cfg.counters {
		for _, s := range []string{sysCoord, sysRedisAlways, sysRedisNo, sysNaiveTxn} {
			if a, ok := rp.agg(scCounter, rp.cfg.counterClients, k, s); ok {
				w("| %s | %s | %s | %s | %s | %d |\n", thousands(float64(k)), s, fmtRate(a.rate), fmtLat(a.p50), fmtLat(a.p99), a.errs)
			}
		}
	}
	w("\n| target | measured | met? |\n|---|---|---|\n")
	for _, k := range rp.cfg.counters {
		c, ok := rp.agg(scCounter, rp.cfg.counterClients, k, sysCoord)
		if !ok {
			continue
		}
		for _, t := range []struct {
			peer string
			goal float64
		}{{sysRedisAlways, 0.5}, {sysNaiveTxn, 10}} {
			p, ok := rp.agg(scCounter, rp.cfg.counterClients, k, t.peer)
			if !ok || p.rate.med == 0 {
				continue
			}
			ratio := c.rate.med / p.rate.med
			met := "**not met**"
			if ratio >= t.goal {
				met = "met"
			}
			w("| %s counters, %d clients: coordinatord ≥ %gx %s | %.2fx | %s |\n", thousands(float64(k)), rp.cfg.counterClients, t.goal, t.peer, ratio, met)
		}
	}
	w("\n")
	return b.String()
}
