package server

import (
	"strings"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
	"github.com/coordinatord/coordinatord/internal/authz"
)

// AdminOnly are the methods only admins may call, whatever their request
// names.
var AdminOnly = map[string]bool{
	coordinatorv1.LockService_ForceRelease_FullMethodName: true,
	coordinatorv1.FenceService_DeleteMark_FullMethodName:  true,
	coordinatorv1.FenceService_RebindMark_FullMethodName:  true,
}

// AnyKnownIdentity are the methods every identity named in the policy may
// call: sessions belong to no lock name (each Acquire through a session is
// checked by its name). A session belongs to the identity that opened it:
// its handle answers no other (PERMISSION_DENIED, checked by the lease
// package), and what it lists or releases is limited to the caller's lock
// prefixes (withLockScope).
var AnyKnownIdentity = map[string]bool{
	coordinatorv1.LockService_OpenSession_FullMethodName:      true,
	coordinatorv1.LockService_KeepAliveSession_FullMethodName: true,
	coordinatorv1.LockService_CloseSession_FullMethodName:     true,
}

// exempt methods need no identity: probes (health) and tools (reflection)
// must reach them.
func exempt(fullMethod string) bool {
	return strings.HasPrefix(fullMethod, "/grpc.health.v1.Health/") ||
		strings.HasPrefix(fullMethod, "/grpc.reflection.")
}

type (
	named    interface{ GetName() string }
	prefixed interface{ GetPrefix() string }
	resource interface{ GetResource() string }
)

// authorize checks one request message of identity id against policy p, by
// the rules AuthInterceptors states: PERMISSION_DENIED (errAdminOnly,
// errNotInPolicy, errDenied) if the policy does not allow it.
func authorize(p *authz.Policy, id, method string, req any) error {
	if AdminOnly[method] {
		if p.IsAdmin(id) {
			return nil
		}
		return errAdminOnly(id, method, "")
	}
	if AnyKnownIdentity[method] {
		if p.Known(id) {
			return nil
		}
		return errNotInPolicy(id)
	}
	// A Hold stream names its lock in its first message (acquire or
	// resume); the handler refuses any other first message, so heartbeats
	// and releases ride on that check.
	if h, ok := req.(*coordinatorv1.HoldRequest); ok {
		switch {
		case h.GetAcquire() != nil:
			req = h.GetAcquire().GetRequest()
		case h.GetResume() != nil:
			req = h.GetResume()
		default:
			return nil
		}
	}
	// ListMarks lists resources, not locks: its prefix is checked against
	// the resource prefixes (and every mark it lists is inside it).
	if r, ok := req.(*coordinatorv1.ListMarksRequest); ok {
		if !p.MayListResources(id, r.GetPrefix()) {
			return errDenied(id, "may not list the marks of this prefix: list a prefix inside your own resource prefixes")
		}
		return nil
	}
	checked := false
	if r, ok := req.(named); ok {
		checked = true
		if !p.MayLock(id, r.GetName()) {
			return errDenied(id, "may not use this lock name")
		}
	}
	if r, ok := req.(prefixed); ok {
		checked = true
		if !p.MayList(id, r.GetPrefix()) {
			return errDenied(id, "may not list this prefix: list a prefix inside your own")
		}
	}
	if r, ok := req.(resource); ok && r.GetResource() != "" {
		checked = true
		if !p.MayResource(id, r.GetResource()) {
			return errDenied(id, "may not use this resource")
		}
	}
	if !checked && !p.IsAdmin(id) {
		return errAdminOnly(id, method, "names no lock")
	}
	return nil
}
