package epoch_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/coordinatord/coordinatord/internal/testcoord"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, testcoord.LeakIgnores...) }
