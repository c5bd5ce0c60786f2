package locktable

// What the table holds now, read by its owner for the metrics
// (internal/shard census.go and endfeed.go). Reads only: nothing here
// changes the table.

// Census counts the locks that have a visible holder (its put committed
// and its delete not: the holders Validate sees) and the calls queued in
// their queues. A waiter counts once, with the retries of its request id
// that share its place; a grant decided but not committed yet is no
// holder yet.
func (t *Table) Census() (held, waiting int) {
	for _, lk := range t.locks {
		for _, g := range lk.holders {
			if g.state != pending {
				held++
				break
			}
		}
		waiting += len(lk.waiters)
	}
	return held, waiting
}

// EndsInFlight calls f with every grant whose delete is in a unit that
// Ready handed out after unit after (the unit's ID) and that has not
// committed or failed yet, and returns the ID of the last unit Ready
// handed out: the after of the next call. Called after each Ready, it sees
// every grant whose end Committed will report in Ready.Ended, while its
// Holder (AcquiredAt above all) can still be read: in that very call,
// since a unit is handed out by one Ready and commits after it.
func (t *Table) EndsInFlight(after uint64, f func(Holder)) (last uint64) {
	for id, u := range t.inflight {
		if id <= after {
			continue
		}
		for _, g := range u.ends {
			f(holderOf(g))
		}
	}
	return t.unitSeq
}
