package main

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/coordinatord/coordinatord/internal/version"
)

// Without -ldflags (a go test binary records no module version or VCS
// revision), coordctl version falls back to "dev".
func TestVersionFallback(t *testing.T) {
	if version.Version != "" {
		t.Skip("built with -ldflags")
	}
	var stdout, stderr bytes.Buffer
	if code := run([]string{"-o", "json", "version"}, &stdout, &stderr); code != exitOK {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	var got struct{ Client build }
	if err := json.Unmarshal(stdout.Bytes(), &got); err != nil {
		t.Fatalf("%v: %s", err, stdout.String())
	}
	if want := (build{Version: "dev", Revision: version.Unknown, GoVersion: version.Get().GoVersion}); got.Client != want {
		t.Errorf("version printed %+v, want %+v", got.Client, want)
	}
}
