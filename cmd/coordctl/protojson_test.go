package main_test

import (
	"encoding/json"
	"reflect"
	"slices"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
)

// TestJSONIsProtoJSON: -o json is protojson, as grpcurl prints the API's
// answers: each command's object, less the names coordctl adds (the lock's
// name...), is its response message as protojson reads it strictly, and
// every field as protojson writes it back (names, int64 strings, RFC 3339
// times, "30s" durations, enum names). Zero values are printed too, as
// protojson's EmitUnpopulated writes them: a field of the message missing
// from the object fails, unless the row names it as left out on purpose
// (epoch printed {} while serving in epoch 0: every field was zero).
func TestJSONIsProtoJSON(t *testing.T) {
	a := acquire(t, "cli/protojson", "--ttl", "30s")
	defer must(t, 0, "release", "cli/protojson", a.token, a.handle)
	must(t, 0, "validate", "cli/protojson", a.token, "--resource", "cli-protojson/res")
	_, slot := semaphoreMark(t, "cli/protojson-sem", "cli-protojson-sem/res")
	tests := []struct {
		name  string
		args  []string
		msg   proto.Message
		extra []string // coordctl's own fields
		// absent are the message's fields coordctl leaves out on purpose:
		// acquire shows slot for a semaphore's permit only (where slot 0
		// means something) and mode for a reader only, and has never shown
		// resumed; list and marks list read every page, so there is no next
		// page token.
		absent []string
	}{
		{"acquire", []string{"acquire", "cli/protojson-2", "--wait", "0s"}, &coordinatorv1.AcquireResponse{}, []string{"name"}, []string{"slot", "mode", "resumed"}},
		{"acquire --limit", []string{"acquire", "cli/protojson-sem-2", "--limit", "3", "--wait", "0s"}, &coordinatorv1.AcquireResponse{}, []string{"name"}, []string{"mode", "resumed"}},
		{"acquire --shared", []string{"acquire", "cli/protojson-rw", "--shared", "--wait", "0s"}, &coordinatorv1.AcquireResponse{}, []string{"name"}, []string{"slot", "resumed"}},
		{"keepalive", []string{"keepalive", "cli/protojson", a.token, a.handle}, &coordinatorv1.KeepAliveResponse{}, []string{"name", "token"}, nil},
		{"validate", []string{"validate", "cli/protojson", a.token}, &coordinatorv1.ValidateTokenResponse{}, []string{"name", "token"}, nil},
		{"describe", []string{"describe", "cli/protojson"}, &coordinatorv1.DescribeResponse{}, []string{"name", "held"}, nil},
		{"list", []string{"list", "cli/protojson"}, &coordinatorv1.ListResponse{}, nil, []string{"nextPageToken"}},
		{"marks get", []string{"marks", "get", "cli-protojson/res"}, &coordinatorv1.GetMarkResponse{}, nil, nil},
		{"marks list", []string{"marks", "list", "cli-protojson/"}, &coordinatorv1.ListMarksResponse{}, nil, []string{"nextPageToken"}},
		{"marks get --slot", []string{"marks", "get", "cli-protojson-sem/res", "--slot", slot}, &coordinatorv1.GetMarkResponse{}, nil, nil},
		{"marks list of slot marks", []string{"marks", "list", "cli-protojson-sem/"}, &coordinatorv1.ListMarksResponse{}, nil, []string{"nextPageToken"}},
		{"session open", []string{"session", "open", "--ttl", "5s"}, &coordinatorv1.OpenSessionResponse{}, nil, nil},
		{"epoch", []string{"epoch"}, &coordinatorv1.GetEpochResponse{}, nil, nil},
		{"hit", []string{"hit", "cli-protojson/counter", "--limit", "5", "--window", "90s"}, &coordinatorv1.HitResponse{}, nil, nil},
		{"counter get", []string{"counter", "get", "cli-protojson/counter"}, &coordinatorv1.GetResponse{}, nil, nil},
		{"counter reset", []string{"counter", "reset", "cli-protojson/counter"}, &coordinatorv1.ResetResponse{}, nil, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := decode(t, must(t, 0, append([]string{"-o", "json"}, tt.args...)...))
			for _, k := range tt.extra {
				delete(got, k)
			}
			b, _ := json.Marshal(got)
			if err := protojson.Unmarshal(b, tt.msg); err != nil {
				t.Fatalf("not a %T in protojson: %v\n%s", tt.msg, err, b)
			}
			back, err := protojson.MarshalOptions{EmitUnpopulated: true}.Marshal(tt.msg)
			if err != nil {
				t.Fatal(err)
			}
			var want map[string]any
			if err := json.Unmarshal(back, &want); err != nil {
				t.Fatal(err)
			}
			for k, v := range got {
				if !reflect.DeepEqual(v, want[k]) {
					t.Errorf("%s: coordctl %#v, protojson %#v", k, v, want[k])
				}
			}
			for k, v := range want {
				if _, ok := got[k]; !ok && !slices.Contains(tt.absent, k) {
					t.Errorf("%s missing (protojson writes %#v): zero values are printed too", k, v)
				}
			}
		})
	}
}
