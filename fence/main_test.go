package fence_test

import (
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/coordinatord/coordinatord/internal/testcoord"
)

var coordinatorAddr string

func TestMain(m *testing.M) {
	coord, err := testcoord.Start()
	if err != nil {
		fmt.Fprintln(os.Stderr, "start coordinator:", err)
		os.Exit(1)
	}
	coordinatorAddr = coord.Addr
	code := m.Run()
	coord.Stop()
	if code == 0 {
		if err := goleak.Find(testcoord.LeakIgnores...); err != nil {
			fmt.Fprintln(os.Stderr, "goroutine leak:", err)
			code = 1
		}
	}
	os.Exit(code)
}
