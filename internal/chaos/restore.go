package chaos

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/etcdutl/v3/snapshot"
	"go.uber.org/zap"
)

// Snapshot saves a backup of the cluster's key-value store the way an
// operator takes one (clientv3 Maintenance.Snapshot, like `etcdctl snapshot
// save`) into a file under the cluster's directory, and returns its path and
// the revision it was taken at.
func (c *Cluster) Snapshot(ctx context.Context) (path string, rev int64, err error) {
	cli, err := c.Client()
	if err != nil {
		return "", 0, err
	}
	defer cli.Close()
	r, err := cli.Get(ctx, "/chaos/snapshot", clientv3.WithCountOnly())
	if err != nil {
		return "", 0, fmt.Errorf("chaos: revision before the snapshot: %w", err)
	}
	rc, err := cli.Snapshot(ctx)
	if err != nil {
		return "", 0, fmt.Errorf("chaos: snapshot: %w", err)
	}
	defer rc.Close()
	f, err := os.CreateTemp(c.dir, "backup-*.db")
	if err != nil {
		return "", 0, err
	}
	if _, err := io.Copy(f, rc); err != nil {
		f.Close()
		return "", 0, fmt.Errorf("chaos: snapshot: %w", err)
	}
	if err := f.Close(); err != nil {
		return "", 0, err
	}
	return f.Name(), r.Header.Revision, nil
}

// StopAll stops every member (as KillMember does): the whole cluster is
// down, the first step of a restore from a backup.
func (c *Cluster) StopAll() {
	for i := range c.names {
		c.KillMember(i)
	}
}

// Restore is an operator's disaster recovery, once StopAll stopped every
// member: each member's data directory is replaced by `etcdutl snapshot
// restore` of snap (with --bump-revision bump --mark-compacted when bump >
// 0), and the members start again on it with the same names, URLs and
// cluster token (so the same cluster and member IDs: no signal of the
// restore). The coordinators are not told.
func (c *Cluster) Restore(snap string, bump uint64) error {
	for i, name := range c.names {
		if c.Alive(i) {
			return fmt.Errorf("chaos: restore: member %d still runs (StopAll first)", i)
		}
		dir := filepath.Join(c.dir, name)
		if err := os.RemoveAll(dir); err != nil {
			return err
		}
		err := snapshot.NewV3(zap.NewNop()).Restore(snapshot.RestoreConfig{
			SnapshotPath:        snap,
			Name:                name,
			OutputDataDir:       dir,
			PeerURLs:            []string{c.peer[i]},
			InitialCluster:      c.initial,
			InitialClusterToken: "chaos",
			RevisionBump:        bump,
			MarkCompacted:       bump > 0,
		})
		if err != nil {
			return fmt.Errorf("chaos: restore member %d: %w", i, err)
		}
	}
	return c.Recover()
}
