package locktable

import "time"

// Sessions. A session lives on the owner of its own shard (internal/shard);
// a lock's table knows of it only through the grants held through it: each
// records the session's id, and its handle is the session's. A session's
// keep-alive renews them, and its close releases them, table by table.

// sessionIn says whether the session already holds or waits for the lock
// (a session holds or waits for a lock at most once).
func sessionIn(lk *lock, session string) bool {
	for _, g := range lk.holders {
		if g.rec.Session == session && g.state != ending {
			return true
		}
	}
	for _, w := range lk.waiters {
		if w.a.Session == session {
			return true
		}
	}
	return false
}

// sessionHolder is the grant of lock with this token held through the
// session, nil if none.
func sessionHolder(lk *lock, token int64, session string) *grant {
	if lk == nil {
		return nil
	}
	for _, g := range lk.holders {
		if g.token == token && g.rec.Session == session {
			return g
		}
	}
	return nil
}

// SessionGrants are the live, unexpired grants held through the session
// whose handle is handle, for the caller: a session's keep-alive renews
// each (KeepAlive with the handle), its close releases each (Release).
func (t *Table) SessionGrants(now time.Time, handle, caller string) []Holder {
	session, secret, ok := parseHandle(handle)
	if !ok || t.dead {
		return nil
	}
	var out []Holder
	for _, lk := range t.locks {
		for _, g := range lk.holders {
			if g.rec.Session == session && g.state == live && g.rec.Caller == caller && g.expires.After(now) && sumMatches(secret, g.rec.Secret) {
				out = append(out, holderOf(g))
			}
		}
	}
	return out
}

// SessionHandle is the handle of the session id with this secret, in the
// form of a grant's handle, so that every grant held through the session
// answers it.
func SessionHandle(id string, secret [16]byte) string { return formatHandle(id, secret[:]) }

// ParseSessionHandle splits a session's handle into its id and secret.
func ParseSessionHandle(h string) (id string, secret [16]byte, ok bool) {
	id, s, ok := parseHandle(h)
	if !ok {
		return "", secret, false
	}
	copy(secret[:], s)
	return id, secret, true
}

// SecretSum is how a record keeps a secret: its SHA-256, hex.
func SecretSum(secret [16]byte) string { return secretSum(secret[:]) }

// SecretMatches compares a secret with a record's sum in constant time.
func SecretMatches(secret [16]byte, sum string) bool { return sumMatches(secret[:], sum) }

// notHeld is the outcome of a Release or KeepAlive that matched no grant of
// the caller's: Forbidden if the handle is that of a session whose grant
// of name and token another identity holds (a session's handle answers
// only its opener, and says so), else otherwise.
func (t *Table) notHeld(now time.Time, name string, token int64, handle, caller string, otherwise Outcome) Outcome {
	id, secret, ok := parseHandle(handle)
	if !ok {
		return otherwise
	}
	g := sessionHolder(t.locks[name], token, id)
	if g != nil && g.state == live && g.rec.Caller != caller && g.expires.After(now) && sumMatches(secret, g.rec.Secret) {
		return Forbidden
	}
	return otherwise
}
