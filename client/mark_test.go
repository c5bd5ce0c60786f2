package client_test

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/coordinatord/coordinatord/client"
)

// TestMarkCalls: each mark call answers the mark, or the code the API
// documents for a resource without one or a malformed name.
func TestMarkCalls(t *testing.T) {
	c := client.New(mustConn(t))
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	g, err := c.AcquireGrant(ctx, "mark-test/lock")
	if err != nil {
		t.Fatal(err)
	}
	if v, err := c.ValidateToken(ctx, g.Name, g.Token, "mark-test/res"); err != nil || !v.Valid {
		t.Fatalf("ValidateToken: %+v, %v", v, err)
	}
	tests := []struct {
		name      string
		call      func() (client.Mark, error)
		code      codes.Code
		wantLock  string
		wantToken int64
	}{
		{"get", func() (client.Mark, error) { return c.GetMark(ctx, "mark-test/res") }, codes.OK, "mark-test/lock", g.Token},
		{"get missing", func() (client.Mark, error) { return c.GetMark(ctx, "mark-test/none") }, codes.NotFound, "", 0},
		{"get empty name", func() (client.Mark, error) { return c.GetMark(ctx, "") }, codes.InvalidArgument, "", 0},
		{"rebind", func() (client.Mark, error) { return c.RebindMark(ctx, "mark-test/res", "mark-test/other") }, codes.OK, "mark-test/other", g.Token},
		{"rebind missing", func() (client.Mark, error) { return c.RebindMark(ctx, "mark-test/none", "x") }, codes.NotFound, "", 0},
		{"rebind empty lock", func() (client.Mark, error) { return c.RebindMark(ctx, "mark-test/res", "") }, codes.InvalidArgument, "", 0},
		{"delete", func() (client.Mark, error) { return c.DeleteMark(ctx, "mark-test/res") }, codes.OK, "mark-test/other", g.Token},
		{"delete again", func() (client.Mark, error) { return c.DeleteMark(ctx, "mark-test/res") }, codes.NotFound, "", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, err := tt.call()
			if got := status.Code(err); got != tt.code {
				t.Fatalf("code %v, want %v (%v)", got, tt.code, err)
			}
			if m.Lock != tt.wantLock || m.Token != tt.wantToken {
				t.Errorf("mark %+v, want lock %q token %d", m, tt.wantLock, tt.wantToken)
			}
			if tt.code == codes.OK && (m.Resource != "mark-test/res" || m.UpdatedAt.IsZero()) {
				t.Errorf("mark %+v: want resource mark-test/res and an update time", m)
			}
		})
	}
}

// TestMarkPagesReadsEveryPage: a page size below the number of marks still
// yields each mark once, in order.
func TestMarkPagesReadsEveryPage(t *testing.T) {
	c := client.New(mustConn(t))
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	g, err := c.AcquireGrant(ctx, "mark-pages/lock")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"mark-pages/a", "mark-pages/b", "mark-pages/c"}
	for _, r := range want {
		if _, err := c.ValidateToken(ctx, g.Name, g.Token, r); err != nil {
			t.Fatal(err)
		}
	}
	var got []string
	for m, err := range c.Marks(ctx, "mark-pages/", client.WithPageSize(2)) {
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, m.Resource)
	}
	if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] || got[2] != want[2] {
		t.Errorf("Marks = %q, want %q", got, want)
	}
}

// TestSlotMarkCalls: the marks a semaphore's holders raise, one per
// (resource, slot), are listed with their slot, and OfSlot reaches each
// apart from the resource's own mark.
func TestSlotMarkCalls(t *testing.T) {
	c := client.New(mustConn(t))
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	g, err := c.AcquireGrant(ctx, "slot-marks/sem", client.WithLimit(2))
	if err != nil {
		t.Fatal(err)
	}
	if v, err := c.ValidateToken(ctx, g.Name, g.Token, "slot-marks/res"); err != nil || !v.Valid {
		t.Fatalf("ValidateToken: %+v, %v", v, err)
	}
	var listed []client.Mark
	for m, err := range c.Marks(ctx, "slot-marks/") {
		if err != nil {
			t.Fatal(err)
		}
		listed = append(listed, m)
	}
	if len(listed) != 1 || listed[0].Resource != "slot-marks/res" || !listed[0].PerSlot || listed[0].Slot != g.Slot || listed[0].Token != g.Token {
		t.Fatalf("Marks: %+v, want slot %d's mark of slot-marks/res at %d", listed, g.Slot, g.Token)
	}
	if _, err := c.GetMark(ctx, "slot-marks/res"); status.Code(err) != codes.NotFound {
		t.Fatalf("the resource's own mark: %v, want NOT_FOUND", err)
	}
	if m, err := c.GetMark(ctx, "slot-marks/res", client.OfSlot(g.Slot)); err != nil || m.Token != g.Token || !m.PerSlot || m.Slot != g.Slot {
		t.Fatalf("GetMark OfSlot(%d): %+v, %v", g.Slot, m, err)
	}
	if m, err := c.RebindMark(ctx, "slot-marks/res", "slot-marks/other", client.OfSlot(g.Slot)); err != nil || m.Lock != "slot-marks/other" {
		t.Fatalf("RebindMark OfSlot(%d): %+v, %v", g.Slot, m, err)
	}
	if m, err := c.DeleteMark(ctx, "slot-marks/res", client.OfSlot(g.Slot)); err != nil || m.Token != g.Token {
		t.Fatalf("DeleteMark OfSlot(%d): %+v, %v", g.Slot, m, err)
	}
	if _, err := c.GetMark(ctx, "slot-marks/res", client.OfSlot(-1)); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("OfSlot(-1): %v, want INVALID_ARGUMENT", err)
	}
}
