// Command storage is the pause demo's protected resource: a tiny in-memory
// key-value store over HTTP whose writes are fenced. Each PUT must carry the
// writer's lock name and fencing token (X-Coordinator-Lock,
// X-Coordinator-Token); a fence.Gate checks the token against a local
// high-water mark and against the coordinator (ValidateToken with this
// store's resource name) and answers 409 Conflict to a stale one.
//
//	PUT /objects/{key}   body = value; fenced
//	GET /objects/{key}   {"value": ..., "token": ...}
//	GET /log             every accepted and refused write, in order
//
// It prints {"event":"listening","addr":"host:port"} on stdout once serving
// and logs each write on stderr.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os/signal"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/coordinatord/coordinatord/client"
	"github.com/coordinatord/coordinatord/fence"
)

// Write is one write attempt as the store saw it.
type Write struct {
	Key    string `json:"key"`
	Value  string `json:"value"`
	Token  int64  `json:"token"`
	Status int    `json:"status"`
	Reason string `json:"reason,omitempty"`
	At     string `json:"at"`
}

// Log is the store's history.
type Log struct {
	Accepted []Write `json:"accepted"`
	Refused  []Write `json:"refused"`
}

type object struct {
	Value string `json:"value"`
	Token int64  `json:"token"`
}

type store struct {
	mu      sync.Mutex
	objects map[string]object
	log     Log
}

func main() {
	listen := flag.String("listen", "127.0.0.1:8080", "HTTP listen address")
	coord := flag.String("coordinator", "127.0.0.1:7070", "coordinatord gRPC address")
	resource := flag.String("resource", "pausedemo/storage", "this store's resource name (its high-water mark in the coordinator)")
	lock := flag.String("lock", "pausedemo", "the only lock name whose tokens are accepted")
	flag.Parse()

	if err := run(*listen, *coord, *resource, *lock); err != nil {
		log.Fatal(err)
	}
}

func run(listen, coord, resource, lock string) error {
	c, err := client.Dial(coord)
	if err != nil {
		return err
	}
	defer c.Close()
	gate, err := fence.NewGate(fence.WithGuard(fence.NewGuard(0)), fence.WithCoordinator(c, resource), fence.WithLock(lock))
	if err != nil {
		return err
	}
	s := &store{objects: map[string]object{}}
	mux := http.NewServeMux()
	mux.Handle("PUT /objects/{key}", s.recordRefusals(gate.Middleware(http.HandlerFunc(s.put))))
	mux.HandleFunc("GET /objects/{key}", s.get)
	mux.HandleFunc("GET /log", s.history)

	lis, err := net.Listen("tcp", listen)
	if err != nil {
		return err
	}
	ev, _ := json.Marshal(map[string]string{"event": "listening", "addr": lis.Addr().String()})
	fmt.Println(string(ev))

	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	if err := srv.Serve(lis); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// put runs only for admitted writes, under the gate's guard.
func (s *store) put(w http.ResponseWriter, r *http.Request) {
	a, _ := fence.FromContext(r.Context())
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	key := r.PathValue("key")
	s.mu.Lock()
	s.objects[key] = object{Value: string(body), Token: a.Token}
	s.log.Accepted = append(s.log.Accepted, Write{Key: key, Value: string(body), Token: a.Token, Status: http.StatusOK, At: now()})
	s.mu.Unlock()
	log.Printf("ACCEPTED %s = %q with token %d", key, body, a.Token)
	w.WriteHeader(http.StatusOK)
}

// recordRefusals logs the writes the gate refused.
func (s *store) recordRefusals(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := &statusRecorder{ResponseWriter: w, status: http.StatusOK}
		next.ServeHTTP(rec, r)
		if rec.status == http.StatusOK {
			return
		}
		token, _ := strconv.ParseInt(r.Header.Get(fence.HeaderToken), 10, 64)
		wr := Write{Key: r.PathValue("key"), Token: token, Status: rec.status, Reason: rec.body, At: now()}
		s.mu.Lock()
		s.log.Refused = append(s.log.Refused, wr)
		s.mu.Unlock()
		log.Printf("REFUSED %s with token %d: %d %s", wr.Key, token, rec.status, rec.body)
	})
}

func (s *store) get(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	o, ok := s.objects[r.PathValue("key")]
	s.mu.Unlock()
	if !ok {
		http.NotFound(w, r)
		return
	}
	writeJSON(w, o)
}

func (s *store) history(w http.ResponseWriter, _ *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	writeJSON(w, s.log)
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}

func now() string { return time.Now().UTC().Format(time.RFC3339Nano) }

type statusRecorder struct {
	http.ResponseWriter
	status int
	body   string
}

func (r *statusRecorder) WriteHeader(code int) {
	r.status = code
	r.ResponseWriter.WriteHeader(code)
}

func (r *statusRecorder) Write(b []byte) (int, error) {
	if r.status != http.StatusOK && len(r.body) < 512 {
		r.body += string(b)
	}
	return r.ResponseWriter.Write(b)
}
