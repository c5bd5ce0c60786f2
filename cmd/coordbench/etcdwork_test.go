package main

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"
)

func TestParseMetrics(t *testing.T) {
	names := []string{metricProposals, metricFsyncs}
	for _, tc := range []struct {
		name    string
		in      string
		want    map[string]float64
		wantErr bool
	}{
		{name: "etcd's exposition", in: `# HELP etcd_server_proposals_committed_total The total number of consensus proposals committed.
# TYPE etcd_server_proposals_committed_total gauge
etcd_server_proposals_committed_total 1234
# TYPE etcd_disk_wal_fsync_duration_seconds histogram
etcd_disk_wal_fsync_duration_seconds_bucket{le="0.001"} 20
etcd_disk_wal_fsync_duration_seconds_bucket{le="+Inf"} 56
etcd_disk_wal_fsync_duration_seconds_sum 0.5
etcd_disk_wal_fsync_duration_seconds_count 56
`, want: map[string]float64{metricProposals: 1234, metricFsyncs: 56}},
		{name: "label sets are summed, exponents and timestamps read", in: `etcd_server_proposals_committed_total{member="a"} 1.5e+06 1700000000000
etcd_server_proposals_committed_total{member="b",x="} {"} 10
etcd_disk_wal_fsync_duration_seconds_count 7
`, want: map[string]float64{metricProposals: 1500010, metricFsyncs: 7}},
		{name: "a longer name with the same prefix is not the metric", in: `etcd_server_proposals_committed_total_extra 99
etcd_server_proposals_committed_total 3
etcd_disk_wal_fsync_duration_seconds_count 4
`, want: map[string]float64{metricProposals: 3, metricFsyncs: 4}},
		{name: "a missing metric", in: "etcd_server_proposals_committed_total 3\n", wantErr: true},
		{name: "a bad value", in: "etcd_server_proposals_committed_total x\netcd_disk_wal_fsync_duration_seconds_count 4\n", wantErr: true},
		{name: "no value", in: "etcd_server_proposals_committed_total\netcd_disk_wal_fsync_duration_seconds_count 4\n", wantErr: true},
		{name: "unterminated labels", in: "etcd_server_proposals_committed_total{a=\"b\" 3\netcd_disk_wal_fsync_duration_seconds_count 4\n", wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseMetrics(strings.NewReader(tc.in), names...)
			if tc.wantErr {
				if err == nil {
					t.Fatalf("accepted, got %v", got)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			for k, v := range tc.want {
				if got[k] != v {
					t.Errorf("%s = %v, want %v", k, got[k], v)
				}
			}
		})
	}
}

func TestEtcdWorkPerOp(t *testing.T) {
	for _, tc := range []struct {
		name          string
		before, after etcdCounters
		cpu0, cpu1    time.Duration
		ops           int
		wantErr       error
		want          perOp
	}{
		{name: "two proposals and a fifth of an fsync per cycle", before: etcdCounters{100, 10}, after: etcdCounters{2100, 210},
			cpu0: time.Second, cpu1: 1500 * time.Millisecond, ops: 1000,
			want: perOp{proposals: 2, fsyncs: 0.2, cpu: 500 * time.Microsecond, opsPerCPUSecond: 2000}},
		{name: "no operation: nothing per operation", before: etcdCounters{1, 1}, after: etcdCounters{5, 5}, cpu1: time.Second, ops: 0},
		{name: "etcd's CPU clock did not tick", before: etcdCounters{0, 0}, after: etcdCounters{10, 10}, ops: 10,
			want: perOp{proposals: 1, fsyncs: 1, opsPerCPUSecond: math.Inf(1)}},
		{name: "counters went back (etcd restarted)", before: etcdCounters{10, 10}, after: etcdCounters{5, 12}, ops: 10, wantErr: errCountersBack},
		{name: "CPU time went back", before: etcdCounters{10, 10}, after: etcdCounters{12, 12}, cpu0: 2 * time.Second, cpu1: time.Second, ops: 10, wantErr: errCountersBack},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w, err := workBetween(tc.before, tc.after, tc.cpu0, tc.cpu1)
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("err = %v, want %v", err, tc.wantErr)
			}
			if got := w.per(tc.ops); got != tc.want {
				t.Errorf("per(%d) = %+v, want %+v", tc.ops, got, tc.want)
			}
		})
	}
}

func TestRatioOf(t *testing.T) {
	for _, tc := range []struct {
		name string
		a, b float64
		want float64
	}{
		{"twice", 4000, 2000, 2},
		{"half", 1000, 2000, 0.5},
		{"unknown peer", 1000, 0, 0},
		{"unknown self", 0, 1000, 0},
		{"infinite peer", 1000, math.Inf(1), 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := ratioOf(tc.a, tc.b); got != tc.want {
				t.Errorf("ratioOf(%v, %v) = %v, want %v", tc.a, tc.b, got, tc.want)
			}
		})
	}
}
