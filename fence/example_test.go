package fence_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/coordinatord/coordinatord/client"
	"github.com/coordinatord/coordinatord/fence"
)

// A single-process resource keeps its own high-water mark: the write with
// token 7, from a holder that was paused while token 9 took over, is
// refused.
func ExampleGuard() {
	g := fence.NewGuard(0)
	value := ""
	put := func(token int64, v string) error {
		return g.Do(token, func() error { value = v; return nil })
	}
	fmt.Println(put(9, "by 9"))
	fmt.Println(errors.Is(put(7, "by 7"), fence.ErrStale))
	fmt.Println(value)
	// Output:
	// <nil>
	// true
	// by 9
}

// An HTTP resource behind a Gate that checks tokens locally and with the
// coordinator (which keeps the resource's high-water mark in etcd). The
// writer sends its lock name and token in the X-Coordinator-* headers.
func ExampleGate_Middleware() {
	c, err := client.Dial(coordinatorAddr) // e.g. "127.0.0.1:7070"
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()

	// The resource side.
	gate, err := fence.NewGate(
		fence.WithGuard(fence.NewGuard(0)),
		fence.WithCoordinator(c, "buckets/invoices"),
		fence.WithLock("invoices-writer"),
	)
	if err != nil {
		fmt.Println(err)
		return
	}
	srv := httptest.NewServer(gate.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Only admitted writes get here.
		w.WriteHeader(http.StatusNoContent)
	})))
	defer srv.Close()

	// The writer side.
	ctx := context.Background()
	lock, err := c.Acquire(ctx, "invoices-writer", client.WithTTL(10*time.Second))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer func() {
		if err := lock.Release(ctx); err != nil {
			fmt.Println(err)
		}
	}()
	write := func(token int64) int {
		req, _ := http.NewRequest(http.MethodPut, srv.URL+"/invoice/42", nil)
		fence.SetHeaders(req.Header, lock.Name(), token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	fmt.Println(write(lock.Token()))
	fmt.Println(write(lock.Token() - 1)) // an older holder's token
	// Output:
	// 204
	// 409
}
