package server

import (
	"context"
	"net"
	"testing"

	"google.golang.org/grpc/peer"

	"github.com/coordinatord/coordinatord/internal/authz"
)

// TestRateKeyGroupsAsCaller: the rate limiter's key tells callers apart
// exactly where caller's string does.
func TestRateKeyGroupsAsCaller(t *testing.T) {
	from := func(a net.Addr) context.Context {
		return peer.NewContext(context.Background(), &peer.Peer{Addr: a})
	}
	tcp := func(ip string, port int) context.Context {
		return from(&net.TCPAddr{IP: net.ParseIP(ip), Port: port})
	}
	ctxs := map[string]context.Context{
		"v4 port 1":           tcp("10.0.0.1", 1),
		"v4 port 2":           tcp("10.0.0.1", 2),
		"v4 as 4 bytes":       from(&net.TCPAddr{IP: net.IPv4(10, 0, 0, 1).To4(), Port: 3}),
		"other v4":            tcp("10.0.0.2", 1),
		"v6":                  tcp("fe80::1", 1),
		"v6 with zone":        from(&net.TCPAddr{IP: net.ParseIP("fe80::1"), Port: 1, Zone: "eth0"}),
		"v6 with zone 2":      from(&net.TCPAddr{IP: net.ParseIP("fe80::1"), Port: 9, Zone: "eth0"}),
		"unix":                from(&net.UnixAddr{Name: "/tmp/s", Net: "unix"}),
		"no peer":             context.Background(),
		"identity":            authz.NewContext(tcp("10.0.0.1", 1), "alice"),
		"identity, elsewhere": authz.NewContext(tcp("10.0.0.9", 1), "alice"),
		"other identity":      authz.NewContext(tcp("10.0.0.1", 1), "bob"),
		"nil IP":              from(&net.TCPAddr{Port: 1}),
	}
	for an, a := range ctxs {
		for bn, b := range ctxs {
			t.Run(an+" vs "+bn, func(t *testing.T) {
				want := caller(a) == caller(b)
				if got := rateKey(a) == rateKey(b); got != want {
					t.Errorf("same key = %v, want %v (caller: %q, %q)", got, want, caller(a), caller(b))
				}
			})
		}
	}
}
