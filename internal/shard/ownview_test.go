package shard

import (
	"fmt"
	"testing"
)

// The view reads and watches the members and the owner keys only: every
// other key of the shard core (grants, marks, mark counts, the count) is
// outside its range, so no member watches the writes of the shards (the
// queue core's holder view watched every write on every replica).
func TestOwnershipViewSeesOnlyMembersAndOwners(t *testing.T) {
	o := &Owner{prefix: "/p/"}
	k := ownKeysFor("/p/")
	in := func(key string) bool { return key >= k.members && key < k.viewEnd() }
	for _, key := range []string{k.member("m1"), k.member("zz"), k.owner(0), k.owner(65535)} {
		if !in(key) {
			t.Errorf("%s is outside the view", key)
		}
	}
	for _, key := range []string{k.count, o.dataPrefix(0) + "lock/1-2-3", o.dataPrefix(255) + "zzz", "/p/shards/marks/res", "/p/shards/markcounts/abc",
		"/p/locks/x", fmt.Sprintf("/p/shards/data/%05d/", 65535)} {
		if in(key) {
			t.Errorf("%s is inside the view: every member would watch it", key)
		}
	}
}
