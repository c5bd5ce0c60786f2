package daemon_test

import (
	"runtime"
	"testing"

	"github.com/coordinatord/coordinatord/internal/daemon"
	"github.com/coordinatord/coordinatord/internal/version"
)

// /metrics has one coordinatord_build_info series, 1, labelled with the
// build's version (here as -ldflags would set it), revision and Go
// toolchain.
func TestBuildInfoMetric(t *testing.T) {
	saved := version.Version
	version.Version = "v1.2.3-test"
	t.Cleanup(func() { version.Version = saved })

	r := run(t, daemon.Config{MetricsListen: "127.0.0.1:0"})
	series := scrape(t, "http://"+r.metrics)["coordinatord_build_info"]
	want := "goversion=" + runtime.Version() + ",revision=" + version.Get().Revision + ",version=v1.2.3-test"
	if len(series) != 1 || series[want] != 1 {
		t.Fatalf("coordinatord_build_info = %v, want {%s: 1}", series, want)
	}
}
