// Package locktable is the lock table of one shard, decided in memory and
// without I/O: a deterministic state machine in the manner of etcd's raft
// package. The shard's owner feeds it calls (Acquire, Release, KeepAlive,
// Cancel), the clock (Tick) and the results of its commits (Committed,
// Failed); Ready hands back what to persist and what to answer. The owner
// does the I/O (internal/shard): it writes each Unit in one guarded etcd
// transaction and calls Committed with that transaction's revision, which
// becomes the token of every grant the unit put.
//
// The rules the table keeps, each checked by the simulation test
// (sim_test.go) over random interleavings by seed:
//
//   - Persist before answer. A grant is answered only after the unit that
//     puts its key has committed; its token is that commit's revision, so
//     tokens rise per name (etcd revisions only rise). A release is
//     answered after the unit that deletes the key has committed.
//   - One commit per hand-off. The end of a holder and the grant to the
//     first eligible waiter are in one unit: the next holder's key is never
//     persisted without the previous holder's deletion, and the hand-off
//     costs one commit.
//   - At most one new grant per name in a unit. Keys in one etcd revision
//     share a create revision, and every holder (a semaphore's, a reader)
//     has a token of its own; the next grant of that name is decided when
//     the unit commits. No unit holds two operations on one key (etcd
//     #22376: a delete and a re-create of one key in one revision, then a
//     compaction at that revision, lose the key).
//   - Reads see commits, not decisions. Validate and Describe see a grant
//     from its commit until the commit of its end, so no reader sees a
//     state that a crash of the owner could undo (validations are
//     linearizable across the takeover). A holder whose TTL ran out stays
//     valid until its deletion commits, which is prompt (the next Tick
//     writes it), and no other holder is admitted before that commit.
//   - Joining a queue and renewing a grant are memory-only: a waiter is
//     nothing in etcd, and a renewal moves the expiry in memory. A new owner
//     therefore honours every grant it loads for its full TTL from the
//     takeover (Load), the longest a renewal the old owner answered can
//     have promised.
//   - Only the grantee renews or releases: the handle carries a secret
//     whose SHA-256 is all the table (and etcd) keeps.
//
// The table is not safe for concurrent use; its owner serializes calls.
package locktable
