package locktable

// Hold is what a validation against a resource needs to know of a token's
// hold on a lock, beyond Validate's verdict: which mark the token answers
// to (a reader's none, a semaphore holder's the mark of its slot, any
// other holder's the resource's own), and the lock's oldest holder (the
// fence package judges a token at or after a reader's or a semaphore's
// oldest holder without a mark).
type Hold struct {
	// Holder is the visible holder with the token; Token 0: none.
	Holder Holder
	// Oldest is the lock's oldest visible holder; Token 0: none.
	Oldest Holder
}

// HoldOf is token's Hold on name, from the visible holders (those whose
// put has committed and whose delete has not), as Validate sees them.
func (t *Table) HoldOf(name string, token int64) Hold {
	var h Hold
	lk := t.locks[name]
	if lk == nil {
		return h
	}
	for _, g := range lk.holders {
		if g.state == pending {
			continue
		}
		if g.token == token {
			h.Holder = holderOf(g)
		}
		if h.Oldest.Token == 0 || g.token < h.Oldest.Token {
			h.Oldest = holderOf(g)
		}
	}
	return h
}
