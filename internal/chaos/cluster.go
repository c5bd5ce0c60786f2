// Package chaos is test infrastructure: a 3-member etcd cluster on loopback,
// coordinator replicas that reach it through fault proxies, a workload that
// records every operation, and the checkers (linearizability with
// porcupine, a fenced register) that judge the recorded history.
package chaos

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/coordinatord/coordinatord/internal/logging"
)

// Cluster is an in-process etcd cluster on 127.0.0.1 with fixed ports, so
// that a killed member restarts where its peers and proxies expect it.
type Cluster struct {
	dir     string
	names   []string
	peer    []string // peer URLs
	client  []string // client URLs
	initial string

	mu      sync.Mutex
	members []*embed.Etcd // nil when killed
	// cutters end the connections that clients (through their proxies)
	// hold to a member: KillMember uses them so that a kill is a crash,
	// not a graceful stop waiting for long-lived streams.
	cutters []func(member int)
}

// OnKill registers f, called while member i is being killed to end the
// connections its clients hold to it.
func (c *Cluster) OnKill(f func(member int)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.cutters = append(c.cutters, f)
}

// freePorts returns n distinct ports the kernel considered free.
func freePorts(n int) ([]int, error) {
	ls := make([]net.Listener, 0, n)
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	ports := make([]int, 0, n)
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// StartCluster starts n members (fast election: TickMs=10, ElectionMs=100)
// with data under dir and waits until they serve.
func StartCluster(dir string, n int) (*Cluster, error) {
	ports, err := freePorts(2 * n)
	if err != nil {
		return nil, err
	}
	c := &Cluster{dir: dir, members: make([]*embed.Etcd, n)}
	var init []string
	for i := range n {
		name := fmt.Sprintf("m%d", i)
		c.names = append(c.names, name)
		c.peer = append(c.peer, fmt.Sprintf("http://127.0.0.1:%d", ports[2*i]))
		c.client = append(c.client, fmt.Sprintf("http://127.0.0.1:%d", ports[2*i+1]))
		init = append(init, name+"="+c.peer[i])
	}
	c.initial = strings.Join(init, ",")
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { errs[i] = c.start(i) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

func (c *Cluster) config(i int) *embed.Config {
	cfg := embed.NewConfig()
	cfg.Name = c.names[i]
	cfg.Dir = filepath.Join(c.dir, c.names[i])
	cfg.TickMs = 10
	cfg.ElectionMs = 100
	pu, _ := url.Parse(c.peer[i])
	cu, _ := url.Parse(c.client[i])
	cfg.ListenPeerUrls = []url.URL{*pu}
	cfg.AdvertisePeerUrls = []url.URL{*pu}
	cfg.ListenClientUrls = []url.URL{*cu}
	cfg.AdvertiseClientUrls = []url.URL{*cu}
	cfg.InitialCluster = c.initial
	cfg.InitialClusterToken = "chaos"
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(logging.Zap(nil, zapcore.FatalLevel))
	return cfg
}

// start runs member i (fresh or on its existing data) and waits until it is
// ready, which needs a quorum.
func (c *Cluster) start(i int) error {
	var e *embed.Etcd
	var err error
	// The port may still be held for a moment by the member just closed.
	for attempt := 0; ; attempt++ {
		e, err = embed.StartEtcd(c.config(i))
		if err == nil || attempt == 50 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		return fmt.Errorf("chaos: start member %d: %w", i, err)
	}
	c.mu.Lock()
	c.members[i] = e
	c.mu.Unlock()
	select {
	case <-e.Server.ReadyNotify():
		return nil
	case err := <-e.Err():
		return fmt.Errorf("chaos: member %d: %w", i, err)
	case <-time.After(60 * time.Second):
		return fmt.Errorf("chaos: member %d not ready after 60s", i)
	}
}

// Size is the number of members.
func (c *Cluster) Size() int { return len(c.names) }

// ClientURL is member i's client URL (proxies point there).
func (c *Cluster) ClientURL(i int) string { return c.client[i] }

// ClientURLs are all members' client URLs.
func (c *Cluster) ClientURLs() []string { return append([]string(nil), c.client...) }

// Alive tells whether member i runs.
func (c *Cluster) Alive(i int) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.members[i] != nil
}

// KillMember stops member i abruptly enough for the test: its listeners
// close and it stops taking part in raft. Its data stays for RestartMember.
func (c *Cluster) KillMember(i int) {
	c.mu.Lock()
	e := c.members[i]
	c.members[i] = nil
	cutters := append([]func(int){}, c.cutters...)
	c.mu.Unlock()
	if e == nil {
		return
	}
	// Close first closes the listeners, then waits for open streams (lease
	// keepalives, watches) up to etcd's request timeout (~6 s): cutting the
	// clients' connections meanwhile makes the kill as quick as a crash.
	done := make(chan struct{})
	go func() { e.Close(); close(done) }()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-done:
			return
		case <-tick.C:
			for _, cut := range cutters {
				cut(i)
			}
		}
	}
}

// RestartMember starts a killed member again on its data dir. It returns
// once the member is ready (which needs a quorum of the cluster).
func (c *Cluster) RestartMember(i int) error {
	if c.Alive(i) {
		return nil
	}
	return c.start(i)
}

// Leader returns the index of the member that is leader, or -1.
func (c *Cluster) Leader() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, e := range c.members {
		if e != nil && e.Server.Leader() == e.Server.MemberID() && e.Server.Leader() != 0 {
			return i
		}
	}
	return -1
}

// WaitLeader waits up to d for a leader and returns its index.
func (c *Cluster) WaitLeader(d time.Duration) (int, error) {
	deadline := time.Now().Add(d)
	for {
		if l := c.Leader(); l >= 0 {
			return l, nil
		}
		if time.Now().After(deadline) {
			return -1, fmt.Errorf("chaos: no etcd leader after %v", d)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// KillLeader kills the current leader and returns its index.
func (c *Cluster) KillLeader() (int, error) {
	l, err := c.WaitLeader(20 * time.Second)
	if err != nil {
		return -1, err
	}
	c.KillMember(l)
	return l, nil
}

// LoseQuorum kills members until only one runs; it returns the killed ones.
func (c *Cluster) LoseQuorum() []int {
	var killed []int
	alive := 0
	for i := range c.names {
		if c.Alive(i) {
			alive++
		}
	}
	for i := range c.names {
		if alive <= len(c.names)/2 {
			break
		}
		if c.Alive(i) {
			c.KillMember(i)
			killed = append(killed, i)
			alive--
		}
	}
	return killed
}

// Recover restarts every killed member (concurrently: a lone member cannot
// become ready without the others) and waits for a leader.
func (c *Cluster) Recover() error {
	var wg sync.WaitGroup
	errs := make([]error, len(c.names))
	for i := range c.names {
		if !c.Alive(i) {
			wg.Go(func() { errs[i] = c.start(i) })
		}
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	_, err := c.WaitLeader(30 * time.Second)
	return err
}

// RestartAll stops every member, then starts them all on their data.
func (c *Cluster) RestartAll() error {
	for i := range c.names {
		c.KillMember(i)
	}
	return c.Recover()
}

// Client is a direct etcd client (no proxy) for assertions.
func (c *Cluster) Client() (*clientv3.Client, error) {
	return clientv3.New(clientv3.Config{Endpoints: c.ClientURLs(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
}

// Close stops every member.
func (c *Cluster) Close() {
	for i := range c.names {
		c.KillMember(i)
	}
}

// Ready waits until a linearizable read through cli succeeds.
func Ready(ctx context.Context, cli *clientv3.Client) error {
	for {
		c, cancel := context.WithTimeout(ctx, 2*time.Second)
		_, err := cli.Get(c, "/chaos/ready")
		cancel()
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("chaos: etcd not serving: %w", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
