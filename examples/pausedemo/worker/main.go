// Command worker is the pause demo's lock holder: it acquires a lock with
// the Go SDK and writes to the storage service with its fencing token,
// checking before each write that the SDK still considers the lock held.
//
// It prints one JSON event per line on stdout:
//
//	{"event":"acquired","token":N,"ttl":"2s","at":"..."}
//	{"event":"wrote","seq":S,"token":N,"status":200}   (409: the store refused)
//	{"event":"lost","err":"...","safe_until":"..."}     (the SDK reported the loss)
//	{"event":"late_write","token":N,"status":409}      (-write-after-loss)
//	{"event":"released"}
//
// With -write-after-loss it writes once more after the SDK reported the
// loss, as a buggy worker would, to show that the store refuses it.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"net/http"
	"os/signal"
	"syscall"
	"time"

	"github.com/coordinatord/coordinatord/client"
	"github.com/coordinatord/coordinatord/fence"
)

type config struct {
	coordinator, storage, lock, key, name string
	ttl, interval                         time.Duration
	writes                                int
	hold, writeAfterLoss                  bool
}

func main() {
	var cfg config
	flag.StringVar(&cfg.coordinator, "coordinator", "127.0.0.1:7070", "coordinatord gRPC address")
	flag.StringVar(&cfg.storage, "storage", "http://127.0.0.1:8080", "storage service base URL")
	flag.StringVar(&cfg.lock, "lock", "pausedemo", "lock name")
	flag.StringVar(&cfg.key, "key", "report", "object key to write")
	flag.StringVar(&cfg.name, "name", "worker", "this worker's name, written into the values")
	flag.DurationVar(&cfg.ttl, "ttl", 2*time.Second, "lease TTL")
	flag.DurationVar(&cfg.interval, "interval", 200*time.Millisecond, "pause between writes")
	flag.IntVar(&cfg.writes, "writes", 0, "number of writes; 0: until the lock is lost")
	flag.BoolVar(&cfg.hold, "hold", false, "after the writes, keep the lock until SIGINT/SIGTERM, then release it")
	flag.BoolVar(&cfg.writeAfterLoss, "write-after-loss", false, "after the SDK reports the loss, write once more anyway")
	flag.Parse()
	if err := run(cfg); err != nil {
		log.Fatal(err)
	}
}

func emit(kv ...any) {
	m := map[string]any{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i].(string)] = kv[i+1]
	}
	b, _ := json.Marshal(m)
	fmt.Println(string(b))
}

func run(cfg config) error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	c, err := client.Dial(cfg.coordinator)
	if err != nil {
		return err
	}
	defer c.Close()

	lock, err := c.Acquire(ctx, cfg.lock, client.WithTTL(cfg.ttl), client.WithOwner(cfg.name))
	if err != nil {
		return fmt.Errorf("acquire %q: %w", cfg.lock, err)
	}
	emit("event", "acquired", "token", lock.Token(), "ttl", lock.TTL().String(), "at", stamp(time.Now()))

	put := func(value string) (int, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodPut, cfg.storage+"/objects/"+cfg.key, bytes.NewBufferString(value))
		if err != nil {
			return 0, err
		}
		fence.SetHeaders(req.Header, cfg.lock, lock.Token())
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode, nil
	}

	for seq := 1; cfg.writes == 0 || seq <= cfg.writes; seq++ {
		// Check right before each write: after a pause, Err already reports
		// the loss (it compares the clock with the safe-until time).
		if lock.Err() != nil {
			break
		}
		status, err := put(fmt.Sprintf("%s-%d", cfg.name, seq))
		if err != nil {
			return err
		}
		emit("event", "wrote", "seq", seq, "token", lock.Token(), "status", status)
		if status == http.StatusConflict {
			break // the store says a newer holder exists
		}
		select {
		case <-lock.Done():
		case <-ctx.Done():
			return release(lock)
		case <-time.After(cfg.interval):
		}
	}
	if err := lock.Err(); err != nil {
		emit("event", "lost", "err", err.Error(), "safe_until", stamp(lock.SafeUntil()))
		if cfg.writeAfterLoss {
			status, err := put(cfg.name + "-late")
			if err != nil {
				return err
			}
			emit("event", "late_write", "token", lock.Token(), "status", status)
		}
		return nil
	}
	if cfg.hold {
		select {
		case <-ctx.Done():
		case <-lock.Done():
			emit("event", "lost", "err", lock.Err().Error())
			return nil
		}
	}
	return release(lock)
}

// stamp is a wall-clock time with nanoseconds, comparable across the
// demo's processes on one machine.
func stamp(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }

func release(lock *client.Lock) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := lock.Release(ctx); err != nil {
		return err
	}
	emit("event", "released")
	return nil
}
