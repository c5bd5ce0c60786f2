package locktable

import "time"

// Reason says why a token is or is not valid (the fence package's reasons).
type Reason int

// Reasons.
const (
	Current    Reason = iota + 1 // the token is a current holder's
	Superseded                   // a newer holder (a greater token) holds the lock
	NotHeldNow                   // nobody holds the lock with this token
)

// Verdict is a validation's answer.
type Verdict struct {
	Valid        bool
	Reason       Reason
	CurrentToken int64 // the newest visible holder's token, 0 when free
}

// Validate judges a token against the lock's visible holders: those whose
// put has committed and whose delete has not.
func (t *Table) Validate(name string, token int64) Verdict {
	lk := t.locks[name]
	if lk == nil {
		return Verdict{Reason: NotHeldNow}
	}
	var newest int64
	for _, g := range lk.holders {
		if g.state == pending {
			continue
		}
		if g.token == token {
			return Verdict{Valid: true, Reason: Current, CurrentToken: token}
		}
		newest = max(newest, g.token)
	}
	switch {
	case newest == 0:
		return Verdict{Reason: NotHeldNow}
	case newest > token:
		return Verdict{Reason: Superseded, CurrentToken: newest}
	default:
		return Verdict{Reason: NotHeldNow, CurrentToken: newest}
	}
}

// Holder is a visible holder, for Describe and List.
type Holder struct {
	Name       string
	Token      int64
	Owner      string
	AcquiredAt time.Time
	ExpiresAt  time.Time
	Shared     bool
	Slot       int32
	Limit      int32
}

// Waiter is a queued call, for Describe.
type Waiter struct {
	Owner        string
	WaitingSince time.Time
	Shared       bool
}

// Describe is a lock's visible holders (oldest first) and its waiters.
func (t *Table) Describe(name string) (holders []Holder, waiters []Waiter) {
	lk := t.locks[name]
	if lk == nil {
		return nil, nil
	}
	for _, g := range lk.holders {
		if g.state != pending {
			holders = append(holders, holderOf(g))
		}
	}
	for _, w := range lk.waiters {
		waiters = append(waiters, Waiter{Owner: w.a.Owner, WaitingSince: w.since, Shared: w.a.Shared})
	}
	return holders, waiters
}

// Holders calls f for every visible holder of every lock, in no order.
func (t *Table) Holders(f func(Holder)) {
	for _, lk := range t.locks {
		for _, g := range lk.holders {
			if g.state != pending {
				f(holderOf(g))
			}
		}
	}
}

func holderOf(g *grant) Holder {
	return Holder{Name: g.rec.Name, Token: g.token, Owner: g.rec.Owner, AcquiredAt: g.acquiredAt,
		ExpiresAt: g.expires, Shared: g.rec.Shared, Slot: g.rec.Slot, Limit: g.rec.Limit}
}
