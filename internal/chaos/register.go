package chaos

import (
	"context"
	"fmt"
	"sync"
)

// Write is one attempted write to the fenced register.
type Write struct {
	Client int
	Name   string
	Token  int64
	// Stale marks a write by a holder that stopped renewing past its TTL
	// (a paused holder): the fault the register exists to stop.
	Stale bool
	// Valid is what the coordinator's validation answered (false also when
	// it could not answer).
	Valid bool
	// Accepted: the register applied the write.
	Accepted bool
	// HighWater is the register's highest accepted token for Name before
	// this write.
	HighWater int64
}

// ValidateFunc asks the coordinator whether token is current for name.
type ValidateFunc func(ctx context.Context, name string, token int64) (bool, error)

// Register is an in-process protected resource with one value per lock
// name. It accepts a write only if the coordinator says the token is valid
// AND the token is not below the highest it accepted for that name. Writes
// to one name are serialized (validation included), so that "valid but below
// the high-water mark" can only mean the coordinator validated a superseded
// token.
type Register struct {
	mu     sync.Mutex
	names  map[string]*sync.Mutex
	hw     map[string]int64
	writes []Write
}

// NewRegister returns an empty register.
func NewRegister() *Register {
	return &Register{names: map[string]*sync.Mutex{}, hw: map[string]int64{}}
}

func (r *Register) lock(name string) *sync.Mutex {
	r.mu.Lock()
	defer r.mu.Unlock()
	m, ok := r.names[name]
	if !ok {
		m = &sync.Mutex{}
		r.names[name] = m
	}
	return m
}

// Write tries a write with token; validate is the coordinator check.
func (r *Register) Write(ctx context.Context, client int, name string, token int64, stale bool, validate ValidateFunc) bool {
	m := r.lock(name)
	m.Lock()
	defer m.Unlock()
	valid, err := validate(ctx, name, token)
	valid = valid && err == nil
	r.mu.Lock()
	defer r.mu.Unlock()
	w := Write{Client: client, Name: name, Token: token, Stale: stale, Valid: valid, HighWater: r.hw[name]}
	w.Accepted = valid && token >= w.HighWater
	if w.Accepted {
		r.hw[name] = token
	}
	r.writes = append(r.writes, w)
	return w.Accepted
}

// Writes is a copy of every write so far, in the order the register
// decided them.
func (r *Register) Writes() []Write {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Write(nil), r.writes...)
}

// RegisterReport sums up a register's writes.
type RegisterReport struct {
	Writes, Accepted, Rejected int
	// StaleAttempts are writes by paused holders; StaleRejected of them
	// were refused.
	StaleAttempts, StaleRejected int
	// Violations: a token accepted below one accepted before, or a token
	// the coordinator called valid below the register's high-water mark.
	Violations []string
}

// CheckRegister checks writes (in decision order): accepted tokens never go
// down per name, and the coordinator never calls a token valid after a
// greater one was accepted for the same name.
func CheckRegister(writes []Write) RegisterReport {
	var rep RegisterReport
	hw := map[string]int64{}
	for _, w := range writes {
		rep.Writes++
		if w.Stale {
			rep.StaleAttempts++
		}
		switch {
		case w.Accepted:
			rep.Accepted++
			if w.Token < hw[w.Name] {
				rep.Violations = append(rep.Violations, fmt.Sprintf("%q: accepted token %d after %d", w.Name, w.Token, hw[w.Name]))
			}
			hw[w.Name] = max(hw[w.Name], w.Token)
		default:
			rep.Rejected++
			if w.Stale {
				rep.StaleRejected++
			}
			if w.Valid && w.Token < hw[w.Name] {
				rep.Violations = append(rep.Violations, fmt.Sprintf("%q: coordinator said token %d is valid after %d was accepted", w.Name, w.Token, hw[w.Name]))
			}
		}
	}
	return rep
}
