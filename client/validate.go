package client

import (
	"context"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
)

// Verdict is the answer of ValidateToken.
type Verdict struct {
	Valid        bool
	Reason       coordinatorv1.ValidateTokenResponse_Reason
	CurrentToken int64
}

// ValidateToken asks whether token is the current holder's for the lock
// name and, with a resource, not below the resource's high-water mark (a
// valid answer advances the mark). UNAVAILABLE is retried until ctx ends.
func (c *Client) ValidateToken(ctx context.Context, name string, token int64, resource string) (Verdict, error) {
	var resp *coordinatorv1.ValidateTokenResponse
	err := c.retry(ctx, func(ctx context.Context) error {
		var err error
		resp, err = c.lc.ValidateToken(ctx, &coordinatorv1.ValidateTokenRequest{Name: name, Token: token, Resource: resource})
		return err
	})
	if err != nil {
		return Verdict{}, err
	}
	return Verdict{Valid: resp.GetValid(), Reason: resp.GetReason(), CurrentToken: resp.GetCurrentToken()}, nil
}
