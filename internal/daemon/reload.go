package daemon

import (
	"context"
	"log/slog"
	"net"
	"os"
	"time"

	"github.com/coordinatord/coordinatord/internal/authz"
)

// reloadAuth re-reads the policy and token files when they change (polled
// every interval) and on a signal from hup, until ctx ends. A file that does
// not load is logged and the previous version stays in force. Without a
// store (no --auth-policy) a signal is logged and changes nothing.
func reloadAuth(ctx context.Context, store *authz.Store, interval time.Duration, hup <-chan os.Signal, log *slog.Logger) {
	if interval <= 0 {
		interval = 5 * time.Second
	}
	var tick <-chan time.Time
	if store != nil {
		t := time.NewTicker(interval)
		defer t.Stop()
		tick = t.C
	}
	for {
		var (
			changed bool
			err     error
		)
		select {
		case <-ctx.Done():
			return
		case <-hup:
			if store == nil {
				log.Info("SIGHUP: nothing to reload (no --auth-policy); still serving")
				continue
			}
			changed, err = store.Reload()
		case <-tick:
			changed, err = store.ReloadIfChanged()
		}
		switch {
		case err != nil:
			log.Error("authorization files do not load; the previous policy stays in force", "err", err)
		case changed:
			log.Info("authorization files reloaded; streams of revoked identities ended")
		}
	}
}

// loopback tells whether a listen address binds only the loopback interface.
func loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
