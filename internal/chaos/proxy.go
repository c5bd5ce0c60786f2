package chaos

import (
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Mode is what a Proxy does with the bytes it carries.
type Mode int

// Proxy modes.
const (
	// Pass forwards bytes unchanged.
	Pass Mode = iota
	// Delay forwards bytes after a fixed delay per chunk.
	Delay
	// Blackhole accepts connections and bytes and silently drops them: the
	// peer sees a connection that never answers. A connection that lost
	// bytes is closed when the mode changes again: TCP never delivers a
	// stream with a hole in it (a real partition ends in retransmission or
	// a reset), and a gRPC connection that carried on after losing frames
	// would lose watch events no real network can lose.
	Blackhole
	// Reset closes every connection and refuses new ones (accepts and
	// closes at once).
	Reset
)

func (m Mode) String() string {
	return [...]string{"pass", "delay", "blackhole", "reset"}[m]
}

// Proxy is a TCP fault proxy on 127.0.0.1 in front of one target address.
type Proxy struct {
	target string
	lis    net.Listener

	mu    sync.Mutex
	mode  Mode
	delay time.Duration
	conns map[net.Conn]*atomic.Bool // each connection's "lost bytes" flag, shared by its pair
	done  bool
	wg    sync.WaitGroup
}

// NewProxy listens on a loopback port and forwards to target ("host:port").
func NewProxy(target string) (*Proxy, error) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{target: target, lis: lis, conns: map[net.Conn]*atomic.Bool{}}
	p.wg.Go(p.serve)
	return p, nil
}

// Addr is the proxy's listen address.
func (p *Proxy) Addr() string { return p.lis.Addr().String() }

// Mode is the current mode.
func (p *Proxy) Mode() Mode {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.mode
}

// Set switches the mode; d is the per-chunk delay of Delay. Reset closes
// the connections open now; any mode but Blackhole closes those that lost
// bytes to a Blackhole.
func (p *Proxy) Set(m Mode, d time.Duration) {
	p.mu.Lock()
	p.mode, p.delay = m, d
	var open []net.Conn
	for c, holed := range p.conns {
		if m == Reset || (m != Blackhole && holed.Load()) {
			open = append(open, c)
		}
	}
	p.mu.Unlock()
	for _, c := range open {
		c.Close()
	}
}

func (p *Proxy) track(c net.Conn, holed *atomic.Bool) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.done {
		return false
	}
	p.conns[c] = holed
	return true
}

func (p *Proxy) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
	c.Close()
}

func (p *Proxy) serve() {
	for {
		c, err := p.lis.Accept()
		if err != nil {
			return
		}
		if p.Mode() == Reset || !p.track(c, new(atomic.Bool)) {
			c.Close()
			continue
		}
		p.wg.Go(func() { p.handle(c) })
	}
}

func (p *Proxy) handle(c net.Conn) {
	defer p.untrack(c)
	p.mu.Lock()
	holed := p.conns[c]
	p.mu.Unlock()
	up, err := net.DialTimeout("tcp", p.target, 2*time.Second)
	if err != nil {
		return
	}
	if !p.track(up, holed) {
		up.Close()
		return
	}
	defer p.untrack(up)
	var wg sync.WaitGroup
	wg.Go(func() { p.pipe(up, c, holed); up.Close(); c.Close() })
	wg.Go(func() { p.pipe(c, up, holed); up.Close(); c.Close() })
	wg.Wait()
}

// pipe copies src to dst, applying the mode to every chunk. Once the pair
// lost bytes (holed), it carries nothing more.
func (p *Proxy) pipe(dst, src net.Conn, holed *atomic.Bool) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			m, d := p.mode, p.delay
			p.mu.Unlock()
			switch {
			case m == Blackhole:
				holed.Store(true) // dropped
			case holed.Load() || m == Reset:
				return
			case m == Delay:
				time.Sleep(d)
				fallthrough
			default:
				if _, werr := dst.Write(buf[:n]); werr != nil {
					return
				}
			}
		}
		if err != nil { // io.EOF or closed: the other direction is closed by handle
			return
		}
	}
}

// Close stops the proxy and every connection, and waits for its goroutines.
func (p *Proxy) Close() {
	p.mu.Lock()
	p.done = true
	open := make([]net.Conn, 0, len(p.conns))
	for c := range p.conns {
		open = append(open, c)
	}
	p.mu.Unlock()
	p.lis.Close()
	for _, c := range open {
		c.Close()
	}
	p.wg.Wait()
}
