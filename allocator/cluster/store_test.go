package cluster

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/rationhq/ration"
	"github.com/rationhq/ration/allocator/ledger"
)

// diskNode starts a one-member node keeping its raft store and snapshots
// in dir, as cmd/allocator does.
func diskNode(t *testing.T, dir string, opts ...Option) (*Node, error) {
	t.Helper()
	_, tr := raft.NewInmemTransport("solo")
	opts = append([]Option{WithBoltStore(filepath.Join(dir, "raft.db")), WithFileSnapshots(filepath.Join(dir, "snapshots"), 2),
		WithRaftConfig(fastRaft)}, opts...)
	nd, err := New("solo", tr, ledgerCfg, opts...)
	if err == nil {
		t.Cleanup(func() { nd.Shutdown() })
	}
	return nd, err
}

// serveSome bootstraps nd alone, waits until it leads and applies a few
// calls; with snapshot, it then takes a snapshot. It returns the state.
func serveSome(t *testing.T, nd *Node, snapshot bool) []byte {
	t.Helper()
	if err := nd.Bootstrap(raft.Server{ID: nd.ID(), Address: nd.Addr()}); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(waitFor); !nd.IsLeader(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no leader")
		}
	}
	for seq := range uint64(5) {
		cmd := ledger.Acquire{Now: 1, Caller: ledger.Caller{SpenderID: "gw", Epoch: 1, Sequence: seq + 1},
			Keys: []ledger.AcquireKey{{Key: "k", Limits: ration.Limits{TPM: 6000}, Want: ration.Amount{Tokens: 10}}}}
		if _, err := nd.Apply(t.Context(), cmd); err != nil {
			t.Fatal(err)
		}
	}
	if snapshot {
		if err := nd.Snapshot(); err != nil {
			t.Fatal(err)
		}
	}
	st, _ := nd.FSM().StateSnapshot()
	return st
}

// TestNodeRefusesALostRaftStore: a member whose raft.db is gone (deleted,
// so a new empty one is made) while its data directory shows it was a
// member (snapshots, or the marker it leaves) is refused with the reason
// and what to do, instead of resuming from a snapshot with no term or
// vote, or bootstrapping a second cluster; forced, it forms a new cluster
// from its latest snapshot, holding that state, and the force is refused
// once it has state again. A damaged raft.db (emptied, cut, flipped
// bytes in its pages) is refused naming it.
func TestNodeRefusesALostRaftStore(t *testing.T) {
	for _, snapshot := range []bool{true, false} {
		t.Run(map[bool]string{true: "with snapshots", false: "marker only"}[snapshot], func(t *testing.T) {
			dir := t.TempDir()
			nd, err := diskNode(t, dir)
			if err != nil {
				t.Fatal(err)
			}
			state := serveSome(t, nd, snapshot)
			nd.Shutdown()
			if err := os.Remove(filepath.Join(dir, "raft.db")); err != nil {
				t.Fatal(err)
			}
			_, err = diskNode(t, dir)
			if !errors.Is(err, ErrLostState) || !strings.Contains(err.Error(), "holds no raft log or vote") {
				t.Fatalf("a lost raft store: %v, want ErrLostState", err)
			}
			nd, err = diskNode(t, dir, WithForceNew([]raft.Server{{ID: "solo", Address: "solo"}}))
			if err != nil {
				t.Fatalf("forced: %v", err)
			}
			if snapshot {
				for deadline := time.Now().Add(waitFor); !nd.IsLeader(); time.Sleep(5 * time.Millisecond) {
					if time.Now().After(deadline) {
						t.Fatal("the recovered cluster elected no leader")
					}
				}
				if st, _ := nd.FSM().StateSnapshot(); string(st) != string(state) {
					t.Fatal("the recovered cluster does not hold the snapshot's state")
				}
			} else {
				serveSome(t, nd, false)
			}
			nd.Shutdown()
			if _, err := diskNode(t, dir, WithForceNew([]raft.Server{{ID: "solo", Address: "solo"}})); err == nil || !strings.Contains(err.Error(), "remove the force flag") {
				t.Fatalf("forcing a member with state: %v", err)
			}
			if nd, err = diskNode(t, dir); err != nil {
				t.Fatalf("restarted: %v", err)
			}
		})
	}
	t.Run("damaged", func(t *testing.T) {
		dir := t.TempDir()
		nd, err := diskNode(t, dir)
		if err != nil {
			t.Fatal(err)
		}
		serveSome(t, nd, false)
		nd.Shutdown()
		path := filepath.Join(dir, "raft.db")
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		page := os.Getpagesize()
		flipped := append([]byte{}, b...)
		for p := 2; p < len(flipped)/page; p++ {
			flipped[p*page+8] ^= 0x5a // each page's flags and count
		}
		for name, bad := range map[string][]byte{"emptied": {}, "cut to a page": b[:page], "pages flipped": flipped} {
			if err := os.WriteFile(path, bad, 0o600); err != nil {
				t.Fatal(err)
			}
			nd, err := diskNode(t, dir)
			if err == nil {
				nd.Shutdown()
			}
			if err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "raft store refused") {
				t.Errorf("%s: %v, want the file refused", name, err)
			}
		}
	})
}
