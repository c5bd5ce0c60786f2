package lease

import (
	"context"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// The request-id retry: an Acquire with the request id of an earlier one
// finds that acquisition (lookupRequest), takes over its waiting entry
// (adoptRequest) or is handed its grant again (regrant). Not to be confused
// with Resume (watch.go), which re-attaches a Hold stream to a grant.

// retryRequest places a retry of o.requestID: handed the grant again if
// its acquisition was granted (regrant), or waiting on its entry, now
// adopted. Nothing found (placed{}, no error): the caller joins afresh.
func (m *Manager) retryRequest(ctx, parent context.Context, name string, o acquireOptions) (placed, error) {
	a, err := m.adoptRequest(ctx, parent, name, o)
	switch {
	case err != nil || a == nil:
		return placed{}, err
	case a.rec.Acquired != 0:
		g, err := m.regrant(ctx, parent, a)
		return placed{grant: g}, err
	}
	return placed{waiter: a}, nil
}

// lookupRequest finds the live acquisition of (caller, name, o.requestID), or
// returns nil; ErrRequestIDReused if it was made with other parameters.
func (m *Manager) lookupRequest(ctx, parent context.Context, name string, o acquireOptions) (*attempt, error) {
	r, err := m.cli.Get(ctx, m.ks.request(o.caller, name, o.requestID))
	if err != nil {
		return nil, m.etcdErr(parent, "read request record", err)
	}
	if len(r.Kvs) == 0 {
		return nil, nil
	}
	req, ok := decodeRequestRecord(r.Kvs[0].Value, r.Kvs[0].Lease)
	if !ok {
		return nil, nil // not ours to interpret; a fresh acquisition replaces it when its lease ends
	}
	if err := req.checkRequest(o); err != nil {
		return nil, err
	}
	id := clientv3.LeaseID(r.Kvs[0].Lease)
	a := &attempt{name: name, queue: m.ks.Queue(name), key: m.ks.key(name, id), id: id}
	k, err := m.cli.Get(ctx, a.key)
	if err != nil {
		return nil, m.etcdErr(parent, "read queue entry", err)
	}
	if len(k.Kvs) == 0 {
		return nil, nil
	}
	a.token, a.modRev = k.Kvs[0].CreateRevision, k.Kvs[0].ModRevision
	a.rec = decodeRecord(k.Kvs[0].Value)
	a.delay = clientv3.LeaseID(a.rec.DelayLease)
	var sum []byte
	a.handle, sum = req.handle(id, o, name)
	if !sameHash(a.rec.HandleHash, sum) {
		return nil, nil
	}
	ttl, err := m.cli.TimeToLive(ctx, id)
	if err != nil {
		return nil, m.etcdErr(parent, "read lease", err)
	}
	if ttl.TTL < 0 { // -1: gone; 0: under a second left
		return nil, nil
	}
	a.ttl = ttl.GrantedTTL
	return a, nil
}

// regrant answers a retry of a granted acquisition: the same grant, its
// lease refreshed (the retry proves the client alive) unless past max hold.
func (m *Manager) regrant(ctx, parent context.Context, a *attempt) (*Grant, error) {
	refreshed := m.now()
	var ttl time.Duration // the lease's remaining TTL, as etcd tells it
	if a.rec.MaxHold == 0 || refreshed.Before(unixTime(a.rec.Acquired).Add(time.Duration(a.rec.MaxHold))) {
		ka, err := m.renew(ctx, a.id, a.delay)
		if err != nil {
			return nil, m.etcdErr(parent, "refresh lease", err)
		}
		ttl = time.Duration(ka) * time.Second
	} else {
		t, err := m.cli.TimeToLive(ctx, a.id)
		if err != nil {
			return nil, m.etcdErr(parent, "read lease", err)
		}
		ttl = time.Duration(max(t.TTL, 0)) * time.Second
	}
	g := m.grantOf(a, refreshed, ttl)
	g.TTL = time.Duration(a.ttl) * time.Second
	g.Resumed = true
	return g, nil
}

// adopt takes over a waiting entry that lookupRequest found: it rewrites the
// entry unchanged, so that its mod revision moves and the call that queued
// it (paused, say, past its caller's deadline) no longer recognises it when
// it cleans up. It reports false if the entry changed since it was read.
func (m *Manager) adopt(ctx, parent context.Context, a *attempt) (bool, error) {
	tr, err := m.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(a.key), "=", a.modRev)).
		Then(clientv3.OpPut(a.key, a.rec.encode(), clientv3.WithIgnoreLease())).Commit()
	if err != nil {
		return false, m.etcdErr(parent, "adopt queue entry", err)
	}
	if !tr.Succeeded {
		return false, nil
	}
	a.modRev = tr.Header.Revision
	return true, nil
}

// maxAdoptRounds bounds how often adoptRequest reads an entry again that
// changed under it.
const maxAdoptRounds = 3

// adoptRequest is lookupRequest, with a waiting entry adopted (a granted one is
// returned as it is, for regrant).
func (m *Manager) adoptRequest(ctx, parent context.Context, name string, o acquireOptions) (*attempt, error) {
	for range maxAdoptRounds {
		a, err := m.lookupRequest(ctx, parent, name, o)
		if err != nil || a == nil || a.rec.Acquired != 0 {
			return a, err
		}
		ok, err := m.adopt(ctx, parent, a)
		if err != nil {
			return nil, err
		}
		if ok {
			return a, nil
		}
		// Granted, adopted by another retry, or ended since it was read.
	}
	return nil, fmt.Errorf("%w: the queue entry of this request id kept changing while it was resumed; retry", ErrUnavailable)
}
