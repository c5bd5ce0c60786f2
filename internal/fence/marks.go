package fence

import (
	"context"
	"encoding/json"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/coordinatord/coordinatord/internal/lease"
)

// Mark is a resource's high-water mark: the greatest token ValidateToken
// has accepted for it. Marks are plain etcd keys, <prefix>fence/<escaped
// resource>, without a lease: they survive restarts and are never removed
// by the coordinator.
type Mark struct {
	Resource string
	// Token is the greatest token accepted for the resource.
	Token int64
	// Lock is the lock name the token was validated with.
	Lock string
	// UpdatedAt is when the mark last advanced (coordinator clock).
	UpdatedAt time.Time
}

// markValue is the stored form of a Mark.
type markValue struct {
	Token int64  `json:"token"`
	Lock  string `json:"lock"`
	At    int64  `json:"at"` // unix ns
}

func (m Mark) encode() string {
	b, _ := json.Marshal(markValue{Token: m.Token, Lock: m.Lock, At: time.Now().UnixNano()}) // plain fields: cannot fail
	return string(b)
}

func decodeMark(resource string, kv *mvccpb.KeyValue) Mark {
	var v markValue
	_ = json.Unmarshal(kv.Value, &v) // a foreign value reads as a zero mark
	m := Mark{Resource: resource, Token: v.Token, Lock: v.Lock}
	if v.At != 0 {
		m.UpdatedAt = time.Unix(0, v.At)
	}
	return m
}

func (v *Validator) marks() string { return v.ks.Prefix() + "fence/" }

func (v *Validator) markKey(resource string) string {
	return v.marks() + lease.EscapeName(resource)
}

// GetMark returns the resource's mark, or ErrNoMark.
func (v *Validator) GetMark(ctx context.Context, resource string) (*Mark, error) {
	if err := lease.ValidateName("resource", resource, false); err != nil {
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
// ("" on the last page). pageSize 0 means lease.DefaultPageSize; above
// lease.MaxPageSize it is lease.MaxPageSize.
func (v *Validator) ListMarks(ctx context.Context, prefix string, pageSize int, pageToken string) ([]Mark, string, error) {
	if err := lease.ValidateName("prefix", prefix, true); err != nil {
		return nil, "", err
	}
	switch {
	case pageSize < 0:
		return nil, "", lease.FieldErr("page_size", "must not be negative, got %d", pageSize)
	case pageSize == 0:
		pageSize = lease.DefaultPageSize
	case pageSize > lease.MaxPageSize:
		pageSize = lease.MaxPageSize
	}
	esc := lease.EscapeName(prefix)
	base := v.marks() + esc
	from := base
	if pageToken != "" {
		after, err := lease.DecodePageToken(pageToken)
		if err != nil {
			return nil, "", err
		}
		if !strings.HasPrefix(after, esc) {
			return nil, "", lease.FieldErr("page_token", "belongs to another prefix; use it with the prefix of the call that returned it")
		}
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
			return out, lease.EncodePageToken(last), nil
		}
		seg := strings.TrimPrefix(string(kv.Key), v.marks())
		out = append(out, decodeMark(lease.UnescapeName(seg), kv))
	}
	return out, "", nil
}
