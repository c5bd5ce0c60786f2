package main

import (
	"flag"
	"strconv"
	"time"

	"github.com/coordinatord/coordinatord/client"
)

// hitLine is the command line of hit.
type hitLine struct {
	name        string
	limit       int64
	window      time.Duration
	hits        int64
	tokenBucket bool
	failOpen    bool
	requestID   string
}

func (f *hitLine) register(fs *flag.FlagSet) {
	fs.Int64Var(&f.limit, "limit", 0, "the most hits allowed per window (required, at least 1)")
	durationVar(fs, &f.window, "window", 0, "the window's `duration` (required, at least 1ms): a fixed window starts at its first hit")
	fs.Int64Var(&f.hits, "hits", 1, "hits to count; 0 reads the counter without counting")
	fs.BoolVar(&f.tokenBucket, "token-bucket", false, "count with a token bucket (limit tokens, refilled at limit per window)")
	fs.BoolVar(&f.failOpen, "fail-open", false, "if the coordinator cannot reach etcd, allow the hit uncounted (default: the server's policy)")
	fs.StringVar(&f.requestID, "request-id", "", "idempotency key (16-128 printable ASCII bytes): a retry with the same id is counted once")
}

func runHit(x *call[hitLine]) (client.HitResult, error) {
	ctx, cancel := x.bounded()
	defer cancel()
	opts := []client.HitOption{client.WithHits(x.f.hits)}
	if x.f.tokenBucket {
		opts = append(opts, client.WithTokenBucket())
	}
	if x.f.failOpen {
		opts = append(opts, client.WithFailOpen())
	}
	if x.f.requestID != "" {
		opts = append(opts, client.WithHitRequestID(x.f.requestID))
	}
	return x.c.Hit(ctx, x.f.name, x.f.limit, x.f.window, opts...)
}

// printHit shows a hit's answer; a refused hit exits with exitNotAcquired.
func printHit(x *call[hitLine], r client.HitResult) int {
	if x.output == "json" {
		x.printJSON(struct {
			Allowed    bool    `json:"allowed"`
			Count      string  `json:"count"`
			Remaining  string  `json:"remaining"`
			ResetAt    *string `json:"resetAt"`
			RetryAfter string  `json:"retryAfter"`
			Uncounted  bool    `json:"uncounted"`
			Replayed   bool    `json:"replayed"`
		}{r.Allowed, i64(r.Count), i64(r.Remaining), ts(r.ResetAt), dur(r.RetryAfter), r.Uncounted, r.Replayed})
	} else {
		x.table([]string{"NAME", "ALLOWED", "COUNT", "REMAINING", "RESET_AT", "RETRY_AFTER"},
			[]string{x.f.name, strconv.FormatBool(r.Allowed), i64(r.Count), i64(r.Remaining), cell(r.ResetAt), r.RetryAfter.String()})
	}
	if !r.Allowed {
		return exitNotAcquired
	}
	return exitOK
}

func printCounter(x *call[string], s client.CounterState) int {
	algo := s.Algorithm
	if x.output == "json" {
		x.printJSON(struct {
			Exists    bool    `json:"exists"`
			Algorithm string  `json:"algorithm"`
			Count     string  `json:"count"`
			Limit     string  `json:"limit"`
			Remaining string  `json:"remaining"`
			ResetAt   *string `json:"resetAt"`
			Window    *string `json:"window"`
		}{s.Exists, algo.String(), i64(s.Count), i64(s.Limit), i64(s.Remaining), ts(s.ResetAt), optDur(s.Exists, s.Window)})
		return exitOK
	}
	x.table([]string{"NAME", "EXISTS", "ALGORITHM", "COUNT", "LIMIT", "REMAINING", "WINDOW", "RESET_AT"},
		[]string{*x.f, strconv.FormatBool(s.Exists), enumName(algo.String(), "ALGORITHM_"), i64(s.Count), i64(s.Limit), i64(s.Remaining),
			s.Window.String(), cell(s.ResetAt)})
	return exitOK
}

// optDur is a duration field that is unset (null) unless set is true.
func optDur(set bool, d time.Duration) *string {
	if !set {
		return nil
	}
	s := dur(d)
	return &s
}

func printCounterReset(x *call[string], existed bool) int {
	if x.output == "json" {
		x.printJSON(struct {
			Existed bool `json:"existed"`
		}{existed})
		return exitOK
	}
	x.table([]string{"NAME", "EXISTED"}, []string{*x.f, strconv.FormatBool(existed)})
	return exitOK
}
