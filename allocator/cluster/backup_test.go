package cluster

import (
	"errors"
	"testing"
)

// TestBackupRestore: a backup of one cluster's leader, restored on the
// leader of a new three-node cluster, becomes every node's state (the
// followers install it as a snapshot), and the commands that follow get
// the replies a single State gives; a damaged backup, or a restore on a
// follower, is refused with nothing changed.
func TestBackupRestore(t *testing.T) {
	w := newWorkload(t)
	src := newCluster(t, 3)
	w.run(src, 40, 4)
	w.check(src.converge())
	backup := src.leader().Backup()

	dst := newCluster(t, 3)
	lead := dst.leader()
	before, _ := lead.FSM().StateSnapshot()
	if err := lead.RestoreBackup(t.Context(), backup[:len(backup)-1]); !errors.Is(err, ErrBadBackup) {
		t.Fatalf("a truncated backup: %v, want ErrBadBackup", err)
	}
	for _, nd := range dst.nodes {
		if nd == lead {
			continue
		}
		var nle *NotLeaderError
		if err := nd.RestoreBackup(t.Context(), backup); !errors.As(err, &nle) || nle.Unknown {
			t.Fatalf("restore on a follower: %v, want a NotLeaderError", err)
		}
	}
	if st, _ := lead.FSM().StateSnapshot(); string(st) != string(before) || lead.FSM().Restores() != 0 {
		t.Fatal("a refused restore changed the state")
	}
	if err := lead.RestoreBackup(t.Context(), backup); err != nil {
		t.Fatal(err)
	}
	w.check(dst.converge())
	for _, nd := range dst.nodes {
		if nd.FSM().Restores() == 0 {
			t.Fatalf("%s did not restore a snapshot", nd.ID())
		}
	}
	w.run(dst, 20, 3)
	w.check(dst.converge())
	members, err := lead.Members()
	if err != nil || len(members) != 3 || members[0].ID != dst.nodes[0].ID() {
		t.Fatalf("members after the restore: %v %v, want the new cluster's own", members, err)
	}
}
