package cluster

import (
	"errors"
	"fmt"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/rationhq/ration"
	"github.com/rationhq/ration/allocator/ledger"
)

// fullDisk is a raft log store whose writes fail with ENOSPC while full.
type fullDisk struct {
	*raft.InmemStore
	full atomic.Bool
}

func (d *fullDisk) StoreLogs(logs []*raft.Log) error {
	if d.full.Load() {
		return fmt.Errorf("write raft.db: %w", syscall.ENOSPC)
	}
	return d.InmemStore.StoreLogs(logs)
}

func (d *fullDisk) StoreLog(l *raft.Log) error { return d.StoreLogs([]*raft.Log{l}) }

// TestNotReadyWhileTheStoreFails: a follower whose raft store cannot
// write (a full disk) is not ready, saying why, while the leader and the
// other follower go on serving; once its writes succeed again, it is
// ready.
func TestNotReadyWhileTheStoreFails(t *testing.T) {
	disk := &fullDisk{InmemStore: raft.NewInmemStore()}
	var nodes []*Node
	var trans []*raft.InmemTransport
	var servers []raft.Server
	for i := range 3 {
		addr, tr := raft.NewInmemTransport(raft.ServerAddress(fmt.Sprintf("mem%d", i)))
		opts := []Option{WithRaftConfig(fastRaft)}
		if i == 2 {
			opts = append(opts, WithStores(disk, disk.InmemStore))
		}
		nd, err := New(raft.ServerID(fmt.Sprintf("n%d", i)), tr, ledgerCfg, opts...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { nd.Shutdown() })
		for _, other := range trans {
			other.Connect(addr, tr)
			tr.Connect(other.LocalAddr(), other)
		}
		nodes, trans = append(nodes, nd), append(trans, tr)
		servers = append(servers, raft.Server{ID: nd.ID(), Address: addr})
	}
	if err := nodes[0].Bootstrap(servers...); err != nil {
		t.Fatal(err)
	}
	await := func(what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(waitFor); !cond(); time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within %v", what, waitFor)
			}
		}
	}
	leader := func() *Node {
		for _, nd := range nodes[:2] {
			if nd.IsLeader() {
				return nd
			}
		}
		return nil
	}
	await("a leader among n0 and n1", func() bool { return leader() != nil && nodes[2].Ready() == nil })
	seq := uint64(0)
	call := func() error {
		seq++
		_, err := leader().Apply(t.Context(), ledger.Acquire{Now: 1, Caller: ledger.Caller{SpenderID: "gw", Epoch: 1, Sequence: seq},
			Keys: []ledger.AcquireKey{{Key: "k", Limits: ration.Limits{TPM: 6000}, Want: ration.Amount{Tokens: 1}}}})
		return err
	}
	disk.full.Store(true)
	if err := call(); err != nil {
		t.Fatalf("the leader with one follower's disk full: %v", err)
	}
	await("n2 unready", func() bool { return errors.Is(nodes[2].Ready(), ErrStoreFailing) })
	if err := nodes[2].Ready(); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("Ready: %v, want the store's error", err)
	}
	for _, nd := range nodes[:2] {
		if err := nd.Ready(); err != nil {
			t.Fatalf("%s: %v", nd.ID(), err)
		}
	}
	disk.full.Store(false)
	if err := call(); err != nil {
		t.Fatal(err)
	}
	await("n2 ready again", func() bool { return nodes[2].Ready() == nil })
}
