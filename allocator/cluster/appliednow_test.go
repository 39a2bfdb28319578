package cluster

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/rationhq/ration/allocator/ledger"
)

// Node.AppliedNow is, on the leader, the latest Now its ledger applied:
// 0 before any command, unchanged by a command proposed behind it (the
// FSM applies that one at the same instant), raised by one ahead. A
// follower answers a NotLeaderError naming the leader, a node shut down
// ErrClosed. A new leader elected right after its predecessor answered a
// command reports that command's instant, though it may have learned
// that the entry was committed only once leading (its first call in the
// term waits for a barrier).
func TestNodeAppliedNow(t *testing.T) {
	ctx := context.Background()
	c := newCluster(t, 3)
	lead := c.leader()
	if now, err := lead.AppliedNow(ctx); err != nil || now != 0 {
		t.Fatalf("before any command: %d, %v; want 0", now, err)
	}
	w := newWorkload(t)
	w.run(c, 5, 1)
	at := w.now
	for _, tc := range []struct {
		name string
		now  int64 // seconds from at
		want int64
	}{
		{"behind", -3, 0},
		{"equal", 0, 0},
		{"ahead", 2, 2},
		{"behind again", 1, 2},
	} {
		c.apply(ledger.Sweep{Now: at + seconds(int(tc.now))})
		if got, err := c.leader().AppliedNow(ctx); err != nil || got != at+seconds(int(tc.want)) {
			t.Fatalf("%s: %d, %v; want %d", tc.name, got, err, at+seconds(int(tc.want)))
		}
	}
	for i, nd := range c.nodes {
		if nd == c.leader() {
			continue
		}
		// Polled: a follower may learn its leader a heartbeat late.
		for deadline := time.Now().Add(waitFor); ; time.Sleep(2 * time.Millisecond) {
			var nle *NotLeaderError
			_, err := nd.AppliedNow(ctx)
			if !errors.As(err, &nle) || nle.Unknown {
				t.Fatalf("follower %d: %v, want a NotLeaderError", i, err)
			}
			if nle.LeaderID == c.leader().ID() {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("follower %d: %v, want it to name %s", i, err, c.leader().ID())
			}
		}
	}
	// Failovers, each right after a command answered at a later instant;
	// the dead member is replaced by a new one each time.
	for k := range 3 {
		latest := at + seconds(10*(k+1))
		c.apply(ledger.Sweep{Now: latest})
		old := c.leader()
		for i, nd := range c.nodes {
			if nd == old {
				c.shutdown(i)
			}
		}
		if got, err := c.leader().AppliedNow(ctx); err != nil || got != latest {
			t.Fatalf("failover %d: the new leader's %d, %v; want %d", k, got, err, latest)
		}
		if _, err := old.AppliedNow(ctx); !errors.Is(err, ErrClosed) {
			t.Fatalf("failover %d: the node shut down answered %v, want ErrClosed", k, err)
		}
		if err := c.leader().RemoveMember(ctx, old.ID(), c); err != nil {
			t.Fatal(err)
		}
		nd := c.add()
		if err := c.leader().AddMember(ctx, nd.ID(), nd.Addr(), c); err != nil {
			t.Fatal(err)
		}
	}
}
