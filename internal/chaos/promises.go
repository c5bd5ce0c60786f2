package chaos

import (
	"fmt"
	"math"
	"time"

	"google.golang.org/grpc/codes"
)

// safeSlack absorbs the difference between the server's wall clock (safe_until)
// and the history's monotonic clock: both are this machine's, so it only
// covers a conversion, not drift. A broken promise leaves seconds.
const safeSlack = 100 * time.Millisecond

// grantLife is what a client was promised about one grant: that it holds
// the lock until safe (the latest safe_until of any answer about it: the
// grant, a retry resuming it, a renewal) unless it releases it first.
type grantLife struct {
	name    string
	token   int64
	client  int
	granted int64 // the first grant answer's return
	safe    int64
	release int64 // the first release call by the grantee (MaxInt64: none)
	limit   int32 // a semaphore's limit (0 or 1: one holder)
	shared  bool  // a read-write lock's reader
}

// CheckSafeUntil reports every grant given while an earlier grant of the
// same name was still inside its safe_until and not released by its holder
// (for a semaphore of N: while N earlier grants were; readers beside
// readers take nothing away):
// the promise that a holder may work until safe_until (coordctl exec, the
// SDK). The proof is one-sided, so it never blames a legal history: a
// greater token is granted only after the earlier grant ended in etcd, every
// OK answer about the earlier grant was computed while it was alive, and
// its lease runs at least until that answer's safe_until (plus the margin)
// unless it is released or revoked. So a second grant answered before the
// earlier one's safe_until means that grant was ended early.
//
// A restore of etcd from a backup ends every grant made before it (the
// token epoch is raised and the old epoch's leases revoked: the documented
// exception to the promise), so an earlier grant made before a restore
// ended is not held against a later grant made after that restore began.
func CheckSafeUntil(ops []Op, restores ...Restore) []string {
	lives := map[[2]any]*grantLife{}
	var order []*grantLife
	for _, op := range ops {
		if op.Outcome != OK || (op.Kind != Acquire && op.Kind != KeepAlive) {
			continue
		}
		k := [2]any{op.Name, op.Token}
		g := lives[k]
		if g == nil {
			g = &grantLife{name: op.Name, token: op.Token, client: op.Client, granted: math.MaxInt64, release: math.MaxInt64}
			lives[k] = g
			order = append(order, g)
		}
		if op.Kind == Acquire {
			g.granted = min(g.granted, op.Return)
			g.limit, g.shared = op.Limit, op.Shared
		}
		g.safe = max(g.safe, op.SafeUntil)
	}
	for _, op := range ops {
		if op.Kind == Release {
			if g := lives[[2]any{op.Name, op.Token}]; g != nil && g.client == op.Client {
				g.release = min(g.release, op.Call)
			}
		}
	}
	var out []string
	for _, later := range order {
		if later.granted == math.MaxInt64 {
			continue
		}
		var inside []*grantLife // earlier grants still promised when later was answered
		for _, early := range order {
			// A release invoked before the later grant's answer may be
			// what ended the earlier grant: not a broken promise.
			if early.name == later.name && early.token < later.token && (!early.shared || !later.shared) &&
				later.granted < early.safe-int64(safeSlack) && later.granted < early.release &&
				!restoredBetween(restores, early.granted, later.granted) {
				inside = append(inside, early)
			}
		}
		if len(inside) < int(max(later.limit, 1)) {
			continue // a semaphore's grant beside fewer than its limit of earlier ones
		}
		for _, early := range inside {
			out = append(out, fmt.Sprintf("%q: token %d (client %d) granted at %d while token %d (client %d) was inside its safe_until %d (%v left), not released",
				later.name, later.token, later.client, later.granted, early.token, early.client, early.safe, time.Duration(early.safe-later.granted)))
		}
	}
	return out
}

// Restore is a restore of etcd from a backup during a history: at Start no
// member ran any more, and at End they served again on the restored data
// (history times, Recorder.Now).
type Restore struct{ Start, End int64 }

// restoredBetween tells whether a restore ended after a grant answered at
// early and began before one answered at later.
func restoredBetween(rs []Restore, early, later int64) bool {
	for _, r := range rs {
		if early < r.End && later > r.Start {
			return true
		}
	}
	return false
}

// CheckRestores reports what a restore must never let through: any
// operation called after a restore began that answered OK about a token
// granted before it (a validation, a renewal, a release, a resource's
// validation: the holder's key may have come back with the snapshot, and
// the token of a grant made after the snapshot may be made again), and any
// grant made after the restore whose token is not above every token granted
// before it, on any name.
func CheckRestores(ops []Op, restores []Restore) []string {
	var out []string
	for _, r := range restores {
		old := map[[2]any]bool{}
		var highest int64
		for _, op := range ops {
			if op.Kind == Acquire && op.Outcome == OK && op.Call < r.Start {
				old[[2]any{op.Name, op.Token}] = true
				highest = max(highest, op.Token)
			}
		}
		for _, op := range ops {
			if op.Call <= r.Start || op.Outcome != OK {
				continue
			}
			switch op.Kind {
			case Acquire:
				if op.Token <= highest {
					out = append(out, fmt.Sprintf("granted token %d after the restore, not above %d granted before it: %v", op.Token, highest, op))
				}
			case Validate, ValidateResource, KeepAlive, Release:
				if old[[2]any{op.Name, op.Token}] {
					out = append(out, fmt.Sprintf("a token granted before the restore answered OK after it: %v", op))
				}
			}
		}
	}
	return out
}

// CheckAnswers reports every call answered INTERNAL or UNKNOWN: under any
// fault the contract has a definite code (UNAVAILABLE for etcd trouble,
// safe to retry), and INTERNAL means a coordinator bug.
func CheckAnswers(ops []Op) []string {
	var out []string
	for _, op := range ops {
		if op.Code == codes.Internal || op.Code == codes.Unknown {
			out = append(out, fmt.Sprintf("answered %v: %v", op.Code, op))
		}
	}
	return out
}
