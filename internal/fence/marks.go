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

// Mark is a resource's high-water mark: the greatest token ValidateToken
// has accepted for it, and the lock that owns it. Marks are plain etcd keys,
// <prefix>fence/<escaped resource>, without a lease: they survive restarts
// and are removed only by an admin (DeleteMark) or by retention (SweepMarks).
type Mark struct {
	Resource string
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

func decodeMark(resource string, kv *mvccpb.KeyValue) Mark {
	var v markValue
	_ = json.Unmarshal(kv.Value, &v) // a foreign value reads as a zero mark
	m := Mark{Resource: resource, Token: v.Token, Lock: v.Lock, creator: v.Creator}
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

func (v *Validator) markKey(resource string) string { return v.ks.Mark(resource) }

// GetMark returns the resource's mark, or ErrNoMark.
func (v *Validator) GetMark(ctx context.Context, resource string) (*Mark, error) {
	if err := keyspace.ValidateName("resource", resource, false); err != nil {
		return nil, err
	}
	r, err := v.cli.Get(ctx, v.markKey(resource))
	if err != nil {
		return nil, v.etcdErr(ctx, "get mark", err)
	}
	if len(r.Kvs) == 0 {
		return nil, ErrNoMark
	}
	m := decodeMark(resource, r.Kvs[0])
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
		seg := strings.TrimPrefix(string(kv.Key), v.marks())
		out = append(out, decodeMark(keyspace.Unescape(seg), kv))
	}
	return out, "", nil
}
