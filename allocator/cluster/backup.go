package cluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"

	"github.com/hashicorp/raft"
)

// ErrBadBackup is wrapped by RestoreBackup's error for a backup that does
// not decode; nothing changed.
var ErrBadBackup = errors.New("cluster: not a backup")

// Backup returns this member's applied state as a backup: the FSM's
// snapshot format (a version byte, the last log index applied, the
// latest Now applied, then the ledger's state). Taken on the leader it
// holds every call answered so far. It waits for an Apply in progress,
// not for raft.
func (n *Node) Backup() []byte { return n.fsm.encode() }

// RestoreBackup replaces the cluster's state with a backup (from Backup),
// on the leader: raft installs it as a snapshot at a new index, past the
// current log, and sends it to every follower. It is for disaster
// recovery into a new cluster: calls answered since the backup are lost,
// so their spenders' next calls may be refused as stale or find less
// than they were granted. A backup that does not decode is refused before
// anything changes (ErrBadBackup). Not the leader: a *NotLeaderError.
func (n *Node) RestoreBackup(ctx context.Context, b []byte) error {
	index, _, _, err := parseSnapshot(n.fsm.cfg, b)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrBadBackup, err)
	}
	if n.raft.State() != raft.Leader {
		addr, id := n.raft.LeaderWithID()
		return &NotLeaderError{Leader: addr, LeaderID: id}
	}
	// raft restores only once this leader has applied its log (a new
	// leader has not yet applied its configuration entry): wait for that.
	if err := n.wait(ctx, n.raft.Barrier(timeout(ctx))); err != nil {
		return err
	}
	meta := &raft.SnapshotMeta{Version: raft.SnapshotVersionMax, Index: index, Size: int64(len(b))}
	if err := n.raft.Restore(meta, bytes.NewReader(b), timeout(ctx)); err != nil {
		return fmt.Errorf("cluster: restore: %w", err)
	}
	return nil
}

// Members returns the cluster's latest configuration as this member
// knows it.
func (n *Node) Members() ([]raft.Server, error) {
	f := n.raft.GetConfiguration()
	if err := f.Error(); err != nil {
		return nil, fmt.Errorf("cluster: configuration: %w", err)
	}
	return f.Configuration().Servers, nil
}
