package server

import (
	"net"
	"sync"
)

// LimitConnections returns a listener that holds at most max connections
// of l open at once; a connection accepted beyond that is closed at once,
// so its client fails fast (UNAVAILABLE) and retries with backoff, instead
// of waiting unseen in the kernel's backlog. Each connection costs buffers
// and goroutines before any call is authenticated, so without a cap a
// client can exhaust the replica with connections alone. max <= 0: l.
func LimitConnections(l net.Listener, max int) net.Listener {
	if max <= 0 {
		return l
	}
	return &limitListener{Listener: l, free: make(chan struct{}, max)}
}

type limitListener struct {
	net.Listener
	free chan struct{} // one token per open connection
}

func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		select {
		case l.free <- struct{}{}:
			return &limitConn{Conn: c, release: func() { <-l.free }}, nil
		default:
			c.Close()
		}
	}
}

// limitConn gives its slot back once, on its first Close.
type limitConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}
