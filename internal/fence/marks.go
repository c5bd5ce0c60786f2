package fence

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/coordinatord/coordinatord/internal/keyspace"
)

// MarkID names one mark: a resource's own (raised by a mutex's holders
// and a read-write lock's writers), or, PerSlot, that of one slot of a
// semaphore that protects the resource (its holders raise one mark per
// (resource, slot), since tokens rise per slot).
type MarkID struct {
	Resource string
	PerSlot  bool
	Slot     int32 // with PerSlot; 0 otherwise
}

// validate refuses a malformed resource name or a negative slot, naming
// the field.
func (id MarkID) validate() error {
	if err := keyspace.ValidateName("resource", id.Resource, false); err != nil {
		return err
	}
	if id.Slot < 0 {
		return keyspace.FieldErr("slot", "is %d; a semaphore's slots are numbered from 0", id.Slot)
	}
	return nil
}

// noMark is ErrNoMark for id, naming the resource and the slot; a missing
// resource's own mark hints at the slots, where a semaphore's marks are.
func (id MarkID) noMark() error {
	if id.PerSlot {
		return fmt.Errorf("%w (resource %q, semaphore slot %d)", ErrNoMark, id.Resource, id.Slot)
	}
	return fmt.Errorf("%w (resource %q; a semaphore's holders raise one mark per slot: name the slot for those)", ErrNoMark, id.Resource)
}

// key is the mark's etcd key.
func (id MarkID) key(ks keyspace.Keyspace) string {
	if id.PerSlot {
		return ks.SlotMark(id.Resource, id.Slot)
	}
	return ks.Mark(id.Resource)
}

// markIDOf names the mark whose etcd key is key.
func markIDOf(ks keyspace.Keyspace, key []byte) MarkID {
	resource, slot, perSlot := ks.MarkOf(string(key))
	return MarkID{Resource: resource, PerSlot: perSlot, Slot: slot}
}

// Mark is a high-water mark: the greatest token ValidateToken has accepted
// for a resource (or one semaphore slot of it, see MarkID), and the lock
// that owns it. Marks are plain etcd keys, <prefix>fence/<escaped resource>
// (/<slot>), without a lease: they survive restarts and are removed only by
// an admin (DeleteMark) or by retention (SweepMarks).
type Mark struct {
	MarkID
	// Token is the greatest token accepted for the resource.
	Token int64
	// Lock is the lock that owns the mark: the first lock whose token
	// raised it, or the lock of the last RebindMark. Only its tokens raise
	// the mark; any other lock's are refused (*MarkOwnedError).
	Lock string
	// UpdatedAt is when the mark last advanced (coordinator clock).
	UpdatedAt time.Time

	// creator is the hex SHA-256 of the identity that created the mark, the
	// identity whose cap counts it; "" for a mark created before marks were
	// counted (it counts against nobody).
	creator string
	// idleSince is when retention first saw the mark's lock free (zero:
	// not seen so); any advance clears it.
	idleSince time.Time
}

// markValue is the stored form of a Mark.
type markValue struct {
	Token   int64  `json:"token"`
	Epoch   int64  `json:"epoch,omitempty"` // the token's epoch (its bits above keyspace.EpochShift), for readers
	Lock    string `json:"lock"`
	At      int64  `json:"at"`             // unix ns
	Creator string `json:"ih,omitempty"`   // hex sha256 of the creating identity
	Idle    int64  `json:"idle,omitempty"` // unix ns; see Mark.idleSince
}

// encode is the stored form of m, stamped as updated now.
func (m Mark) encode() string {
	return m.encodeAt(time.Now())
}

// encodeAt is the stored form of m, stamped as updated at.
func (m Mark) encodeAt(at time.Time) string {
	e, _ := keyspace.SplitToken(m.Token)
	v := markValue{Token: m.Token, Epoch: e, Lock: m.Lock, At: at.UnixNano(), Creator: m.creator}
	if !m.idleSince.IsZero() {
		v.Idle = m.idleSince.UnixNano()
	}
	b, _ := json.Marshal(v) // plain fields: cannot fail
	return string(b)
}

func decodeMark(id MarkID, kv *mvccpb.KeyValue) Mark {
	var v markValue
	_ = json.Unmarshal(kv.Value, &v) // a foreign value reads as a zero mark
	m := Mark{MarkID: id, Token: v.Token, Lock: v.Lock, creator: v.Creator}
	if v.At != 0 {
		m.UpdatedAt = time.Unix(0, v.At)
	}
	if v.Idle != 0 {
		m.idleSince = time.Unix(0, v.Idle)
	}
	return m
}

// ErrMarkOwnedByOtherLock: the resource's mark belongs to another lock.
// Returned as *MarkOwnedError.
var ErrMarkOwnedByOtherLock = errors.New("fence: the resource's mark belongs to another lock")

// MarkOwnedError refuses a validation against a resource whose mark belongs
// to another lock than the one validated: one lock's holder must not raise
// (and so fence) a resource that another lock protects.
type MarkOwnedError struct {
	Resource, Lock, Owner string
}

func (e *MarkOwnedError) Error() string {
	return fmt.Sprintf("fence: resource %q is protected by lock %q, not %q: validate that lock's token, "+
		"or ask an admin to rebind the mark (RebindMark) if the resource changed hands", e.Resource, e.Owner, e.Lock)
}

// Is makes errors.Is(err, ErrMarkOwnedByOtherLock) true.
func (e *MarkOwnedError) Is(target error) bool { return target == ErrMarkOwnedByOtherLock }

func (v *Validator) marks() string { return v.ks.Marks() }

// GetMark returns the mark id names, or ErrNoMark.
func (v *Validator) GetMark(ctx context.Context, id MarkID) (*Mark, error) {
	if err := id.validate(); err != nil {
		return nil, err
	}
	_, m, err := v.readMark(ctx, id)
	if err != nil {
		return nil, err
	}
	return &m, nil
}

// ListMarks returns up to pageSize marks of resources whose names start with
// prefix, in the byte order of the escaped names ('%' and '/' read as "%25"
// and "%2F"), after the cursor pageToken, and the cursor of the next page
// ("" on the last page). pageSize 0 means keyspace.DefaultPageSize; above
// keyspace.MaxPageSize it is keyspace.MaxPageSize.
func (v *Validator) ListMarks(ctx context.Context, prefix string, pageSize int, pageToken string) ([]Mark, string, error) {
	if err := keyspace.ValidateName("prefix", prefix, true); err != nil {
		return nil, "", err
	}
	pageSize, err := keyspace.PageSize(pageSize)
	if err != nil {
		return nil, "", err
	}
	esc := keyspace.Escape(prefix)
	after, err := keyspace.DecodePageToken(pageToken, esc)
	if err != nil {
		return nil, "", err
	}
	base := v.marks() + esc
	from := base
	if after != "" {
		from = v.marks() + after + "\x00"
	}
	// One more than a page tells whether another page follows.
	r, err := v.cli.Get(ctx, from, clientv3.WithRange(clientv3.GetPrefixRangeEnd(base)), clientv3.WithLimit(int64(pageSize)+1))
	if err != nil {
		return nil, "", v.etcdErr(ctx, "list marks", err)
	}
	var out []Mark
	for _, kv := range r.Kvs {
		if len(out) == pageSize {
			last := strings.TrimPrefix(string(r.Kvs[pageSize-1].Key), v.marks())
			return out, keyspace.EncodePageToken(last), nil
		}
		out = append(out, decodeMark(markIDOf(v.ks, kv.Key), kv))
	}
	return out, "", nil
}
