package epoch

import (
	"encoding/json"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
)

// The two keys of the epoch subtree (internal/keyspace: Epoch, EpochBeacon)
// hold JSON records.

// record is the value of the epoch key. A missing key is epoch 0, ready.
type record struct {
	Epoch int64 `json:"epoch"`
	// State is stateReady, or stateFencing from the bump until every queue
	// entry and lease of the earlier epochs is gone; no replica grants or
	// validates meanwhile.
	State  string    `json:"state"`
	Reason string    `json:"reason,omitempty"` // why the epoch was raised
	At     time.Time `json:"at,omitzero"`      // when
}

const (
	stateReady   = "ready"
	stateFencing = "fencing"
)

// beacon is the value of the beacon key: the raft position a coordinator
// saw just before it wrote it. etcd's raft index and term only grow in a
// live cluster; a restore restarts them at 1, so a live index or term below
// the beacon's shows a restore even to a coordinator that just started.
type beacon struct {
	Epoch     int64     `json:"epoch"`
	RaftIndex uint64    `json:"raftIndex"`
	RaftTerm  uint64    `json:"raftTerm"`
	At        time.Time `json:"at,omitzero"`
}

func decodeRecord(kv *mvccpb.KeyValue) record {
	r := record{State: stateReady}
	if kv != nil {
		_ = json.Unmarshal(kv.Value, &r) // a garbled record reads as epoch 0: the beacon still detects restores
	}
	return r
}

func decodeBeacon(kv *mvccpb.KeyValue) *beacon {
	if kv == nil {
		return nil
	}
	var b beacon
	if json.Unmarshal(kv.Value, &b) != nil {
		return nil
	}
	return &b
}

func encode(v any) string {
	b, _ := json.Marshal(v) // plain structs: never fails
	return string(b)
}
