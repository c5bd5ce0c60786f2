package client

import (
	"context"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
)

// Epoch is a replica's token epoch. Tokens are Epoch * 2^48 + the etcd
// create revision of the grant; the epoch is raised when the coordinators
// detect that etcd was restored from a backup, so every token issued after
// a restore is greater than every token issued before it.
type Epoch struct {
	// Epoch is 0 until the first restore was detected.
	Epoch int64
	// Floor is the smallest token of the epoch: every token below it was
	// issued before a restore and is never valid again.
	Floor int64
	// Paused says why the replica grants and validates nothing for now
	// (it is raising the epoch, or has not checked etcd recently); empty
	// while it serves.
	Paused string
}

// Epoch returns the token epoch of the replica that answers (an admin's
// call, with authorization). UNAVAILABLE is retried until ctx ends.
func (c *Client) Epoch(ctx context.Context) (Epoch, error) {
	var resp *coordinatorv1.GetEpochResponse
	err := c.retry(ctx, func(ctx context.Context) error {
		var err error
		resp, err = c.fc.GetEpoch(ctx, &coordinatorv1.GetEpochRequest{})
		return err
	})
	return Epoch{Epoch: resp.GetEpoch(), Floor: resp.GetFloor(), Paused: resp.GetPaused()}, err
}
