package lease

import (
	"bytes"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// A request record is per (identity, name, request id), and its handle
// depends on every input, the record's salt included: knowing another
// identity's request id (and its name and lease) neither finds its record
// nor yields its handle.
func TestRequestKeyAndHandleAreBoundToTheCaller(t *testing.T) {
	ks := NewKeyspace("/p")
	const id = "0123456789abcdef"
	if ks.request("a", "n", id) == ks.request("b", "n", id) {
		t.Fatal("two identities share a request record")
	}
	if ks.request("", "n", id) == ks.request("a", "n", id) {
		t.Fatal("an unauthenticated caller shares an identity's request record")
	}
	if ks.request("ab", "n", "c"+id) == ks.request("a", "n", "bc"+id) {
		t.Fatal("field boundaries are ambiguous")
	}
	lease := clientv3.LeaseID(0x1234)
	o := acquireOptions{requestID: id, caller: "a", ttl: 10 * time.Second, given: givenTTL}
	rec := newRequestRecord(lease, o)
	h1, _ := rec.handle(lease, o, "n")
	if h2, _ := rec.handle(lease, o, "n"); h2 != h1 {
		t.Fatal("a retry does not derive the same handle")
	}
	other := o
	other.caller = "b"
	if h, _ := rec.handle(lease, other, "n"); h == h1 {
		t.Fatal("another identity derives the same handle")
	}
	rec2 := newRequestRecord(lease, o)
	if bytes.Equal(rec.Salt, rec2.Salt) {
		t.Fatal("salts repeat")
	}
	if h, _ := rec2.handle(lease, o, "n"); h == h1 {
		t.Fatal("the handle does not depend on the record's salt")
	}
	// The parameters digest ignores the wait, not the rest.
	waited := o
	waited.wait, waited.hasWait = time.Minute, true
	if rec.checkRequest(waited) != nil {
		t.Fatal("another wait is refused")
	}
	longer := o
	longer.ttl = 11 * time.Second
	if rec.checkRequest(longer) == nil {
		t.Fatal("another ttl is accepted")
	}
	unset := o
	unset.given = 0
	if rec.checkRequest(unset) == nil {
		t.Fatal("an unset ttl is taken for the one given")
	}
	// Round trip, and a value of an older version is not ours.
	if got, ok := decodeRequestRecord([]byte(rec.encode()), int64(lease)); !ok || !bytes.Equal(got.Salt, rec.Salt) {
		t.Fatalf("round trip = %+v, %v", got, ok)
	}
	if _, ok := decodeRequestRecord([]byte("1234"), int64(lease)); ok {
		t.Fatal("an older record (the bare lease id) was read as ours")
	}
	if _, ok := decodeRequestRecord([]byte(rec.encode()), int64(lease)+1); ok {
		t.Fatal("a record on another lease was read as ours")
	}
}
