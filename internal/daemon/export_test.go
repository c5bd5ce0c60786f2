package daemon

import "github.com/coordinatord/coordinatord/internal/shard"

// Shards is the daemon's shard-owner core, nil on the queue core: the
// tests wait until it serves every shard.
func (d *Daemon) Shards() *shard.Owner { return d.coord.Shards() }
