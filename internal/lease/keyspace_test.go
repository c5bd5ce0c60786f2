package lease

import (
	"strings"
	"testing"

	"github.com/coordinatord/coordinatord/internal/keyspace"
)

// The key methods still defined beside their users (ended, waiterSlots,
// ownersOf, request) spell their keys as internal/keyspace does, the one
// layout fence and lease share.
func TestKeyMethodsAgreeWithKeyspace(t *testing.T) {
	ks := NewKeyspace("/p")
	for _, name := range []string{"a", "a/b", "%"} {
		ih := identityHash("spiffe://x/" + name)
		for _, tc := range []struct{ got, want string }{
			{ks.ended(name), ks.Ended(name)},
			{ks.waiterSlots(name), ks.WaiterSlots(name)},
			{ks.ownersOf(ih), ks.Owners(ih)},
			{ks.key(name, 9), ks.Key(name, 9)},
			{ks.delay(name), ks.Delay(name)},
			{ih, keyspace.IdentityHash("spiffe://x/" + name)},
		} {
			if tc.got != tc.want {
				t.Errorf("%q: lease spells %q, keyspace %q", name, tc.got, tc.want)
			}
		}
		req := ks.request("spiffe://x/id", name, "0123456789abcdef")
		if digest, ok := strings.CutPrefix(req, ks.Request(name, "")); !ok || len(digest) != 64 || strings.Contains(digest, "/") {
			t.Errorf("%q: request key %q is not keyspace's Request(name, <digest>)", name, req)
		}
	}
}
