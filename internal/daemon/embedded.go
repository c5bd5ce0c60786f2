package daemon

import (
	"context"
	"fmt"
	"log/slog"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/coordinatord/coordinatord/internal/embedetcd"
	"github.com/coordinatord/coordinatord/internal/lease"
)

// startEmbedded runs the single-member etcd of single-node mode, private to
// this process (a unix socket in DataDir/private), compacting its history
// and keeping its store under the quota by itself.
func startEmbedded(ctx context.Context, cfg Config, log *slog.Logger) (*embedetcd.Server, error) {
	mode, retention := cfg.compaction()
	opts := []embedetcd.Option{embedetcd.WithLogger(log), embedetcd.WithAutoCompaction(mode, retention),
		embedetcd.WithQuota(cfg.EtcdQuotaBackendBytes)}
	if cfg.EtcdSpaceCheck > 0 {
		opts = append(opts, embedetcd.WithSpaceCheck(cfg.EtcdSpaceCheck))
	}
	if retention == "0" {
		log.Warn("embedded etcd auto-compaction is off: its history grows until the quota is reached; "+
			"then compaction under space pressure drops all of it at once", "data_dir", cfg.DataDir)
	}
	return embedetcd.Start(ctx, cfg.DataDir, opts...)
}

// etcdProbe is the readiness probe: a linearizable read (etcd answers, with
// quorum) and the alarm list (a NOSPACE alarm means every write fails: the
// replica is not ready until it is disarmed). Both need quorum; the alarm
// list is one raft entry per probe, not an mvcc write.
func etcdProbe(cli *clientv3.Client, key string) func(context.Context) error {
	return func(ctx context.Context) error {
		if _, err := cli.Get(ctx, key, clientv3.WithCountOnly()); err != nil {
			return err
		}
		alarms, err := cli.AlarmList(ctx)
		if err != nil {
			return err
		}
		for _, a := range alarms.Alarms {
			if a.Alarm == pb.AlarmType_NOSPACE {
				return fmt.Errorf("%w (member %x)", lease.ErrStoreFull, a.MemberID)
			}
		}
		return nil
	}
}

// neverCompactedAfter is the revision past which an external etcd that
// still has revision 1 is reported: its history (~776 B per acquire and
// release) has never been compacted and is heading for the quota.
const neverCompactedAfter = 1_000_000

// warnIfNeverCompacted logs a warning when the external etcd at rev still
// serves revision 1, which it does only if it never compacted: the flags it
// needs are --auto-compaction-mode/--auto-compaction-retention. etcd does
// not expose its configuration, so this is the one sign a client can read.
func warnIfNeverCompacted(ctx context.Context, cli *clientv3.Client, key string, rev int64, log *slog.Logger) {
	if rev < neverCompactedAfter {
		return
	}
	if _, err := cli.Get(ctx, key, clientv3.WithRev(1), clientv3.WithCountOnly()); err == nil {
		log.Warn("etcd has never compacted its history (revision 1 is still readable): it will fill its quota and refuse writes; "+
			"run it with --auto-compaction-mode=periodic --auto-compaction-retention=5m (see deploy/README.md)", "revision", rev)
	}
}
