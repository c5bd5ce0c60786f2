package locktable

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
)

// Reservations: the per-identity lock limit on the shard-owner core
// (internal/shard, identity*.go). An Acquire of a limited identity first
// takes one slot of the identity's count, kept by the owner of the
// shard the count lives on (its home), and only then queues here. The
// slot's id rides on the call (Acquire.Reservation) into the grant's record
// (Record.Reservation), so that whichever owner holds the grant, this one
// or the next after a failover, finds the slot in what it loaded, keeps it
// alive while the grant lives and frees it when the grant ends. The table
// only carries the id: it decides nothing by it.

// Reserved is a grant that holds a reservation.
type Reserved struct {
	Name        string
	Caller      string // the identity whose count the slot is of
	Reservation string
	Token       int64 // 0 while its put has not committed
}

// Reservations calls f for every grant of the table holding a reservation,
// in no order, whatever its state: pending (decided, not committed),
// live, or ending (its end decided, its delete not yet committed: the slot
// is freed only once the grant is gone from etcd too).
func (t *Table) Reservations(f func(Reserved)) {
	for _, g := range t.grants {
		if g.rec.Reservation != "" {
			f(reservedOf(g))
		}
	}
}

// ReservedBy is the grant of name holding the reservation id, whatever its
// state, if there is one.
func (t *Table) ReservedBy(name, id string) (Reserved, bool) {
	lk := t.locks[name]
	if lk == nil || id == "" {
		return Reserved{}, false
	}
	for _, g := range lk.holders {
		if g.rec.Reservation == id {
			return reservedOf(g), true
		}
	}
	return Reserved{}, false
}

func reservedOf(g *grant) Reserved {
	r := Reserved{Name: g.rec.Name, Caller: g.rec.Caller, Reservation: g.rec.Reservation}
	if g.state != pending {
		r.Token = g.token
	}
	return r
}

// ReservationID is the id of the slot an Acquire of name by caller takes:
// with a request id, derived from it (an HMAC keyed by the id, as a
// retried request's handle is: derivedSecret), so that a retry on any owner
// takes the same slot again rather than a second one; without, random.
// 32 hex digits.
func ReservationID(requestID, caller, name string, random [16]byte) string {
	if requestID == "" {
		return hex.EncodeToString(random[:])
	}
	m := hmac.New(sha256.New, []byte(requestID))
	m.Write([]byte("reservation\x00" + caller + "\x00" + name))
	return hex.EncodeToString(m.Sum(nil)[:16])
}
