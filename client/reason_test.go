package client_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
	"github.com/coordinatord/coordinatord/client"
)

// Issue 19.4: the SDK exposes the reason of the coordinator's errors, and
// its metadata under lowerCamel keys; the reasons it names are values of
// the proto's ErrorReason.
func TestReasonOf(t *testing.T) {
	c := dial(t)
	l, err := c.Acquire(ctxT(t, 10*time.Second), "t/reason", client.WithTTL(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = l.Release(ctxT(t, 10*time.Second)) }()

	_, held := c.TryAcquire(ctxT(t, 10*time.Second), "t/reason")
	g, err := c.AcquireGrant(ctxT(t, 10*time.Second), "t/reason-released")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Release(ctxT(t, 10*time.Second), g.GrantRef); err != nil {
		t.Fatal(err)
	}
	_, gone := c.KeepAlive(ctxT(t, 10*time.Second), g.GrantRef)
	for _, tc := range []struct {
		name   string
		err    error
		reason string
		code   codes.Code
	}{
		{"TryAcquire of a held lock", held, client.ReasonLockHeld, codes.Aborted},
		{"KeepAlive of a released grant", gone, client.ReasonNotHeld, codes.NotFound},
		{"wrapped", fmt.Errorf("work: %w", gone), client.ReasonNotHeld, codes.NotFound},
		{"nil", nil, "", codes.OK},
		{"not a status", errors.New("boom"), "", codes.Unknown},
		{"a status without ErrorInfo", status.Error(codes.Unavailable, "connection refused"), "", codes.Unavailable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := client.ReasonOf(tc.err); got != tc.reason || status.Code(tc.err) != tc.code {
				t.Errorf("ReasonOf(%v) = %q (code %v), want %q (%v)", tc.err, got, status.Code(tc.err), tc.reason, tc.code)
			}
		})
	}
	if got := client.MetadataOf(held)["holderToken"]; got != fmt.Sprint(l.Token()) {
		t.Errorf("holderToken %q, want %d", got, l.Token())
	}
	for _, r := range []string{client.ReasonLockHeld, client.ReasonNotHeld, client.ReasonLostWhileWaiting,
		client.ReasonSessionNotFound, client.ReasonMaxHoldReached, client.ReasonRequestIDReused} {
		if _, ok := coordinatorv1.ErrorReason_value["ERROR_REASON_"+r]; !ok {
			t.Errorf("the SDK's reason %s is not in the proto's ErrorReason", r)
		}
	}
	if got := client.Reason(coordinatorv1.ErrorReason_ERROR_REASON_LOCK_HELD); got != "LOCK_HELD" {
		t.Errorf("Reason(ERROR_REASON_LOCK_HELD) = %q", got)
	}
	if _, ok := client.RetryDelayOf(held); ok {
		t.Error("an ABORTED answer carries a RetryInfo")
	}
}
