package cluster

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/rationhq/ration/allocator/ledger"
)

// Ready across an election, a node cut off, a follower behind in applying
// and a shutdown.
func TestNodeReady(t *testing.T) {
	c := newCluster(t, 3)
	outsider := c.add() // connected, but not a member: no leader ever talks to it
	c.allReadyExcept(outsider)
	if err := outsider.Ready(); !errors.Is(err, ErrNoLeader) || !strings.Contains(err.Error(), "no leader known") {
		t.Fatalf("a node outside the cluster: %v, want ErrNoLeader", err)
	}

	// A follower cut off loses its leader; back, it follows one again.
	ld := c.leader()
	cut := 0
	for c.nodes[cut] == ld {
		cut++
	}
	c.disconnect(cut)
	pollUntil(t, "the cut node loses its leader", func() bool { return errors.Is(c.nodes[cut].Ready(), ErrNoLeader) })
	if err := c.leader().Ready(); err != nil {
		t.Fatalf("the leader, with one follower left: %v", err)
	}
	c.reconnect(cut)
	c.allReadyExcept(outsider)

	// A follower whose FSM is held up falls behind the commit index it
	// knows: catching up, then ready once it has applied.
	ld = c.leader()
	slow := 0
	for c.nodes[slow] == ld {
		slow++
	}
	var unlock sync.Once
	c.nodes[slow].FSM().mu.Lock()
	release := func() { unlock.Do(c.nodes[slow].FSM().mu.Unlock) }
	t.Cleanup(release) // before the nodes shut down (cleanups run last first)
	w := newWorkload(t)
	w.run(c, ReadyLag+10, 1)
	var err error
	pollUntil(t, "the held-up follower reports catching up", func() bool { err = c.nodes[slow].Ready(); return errors.Is(err, ErrCatchingUp) })
	var behind, commit, applied uint64
	if _, serr := fmt.Sscanf(err.Error(), "cluster: catching up %d entries (commit index %d, applied %d;", &behind, &commit, &applied); serr != nil ||
		behind != commit-applied || behind <= ReadyLag {
		t.Fatalf("catching up: %v (%v)", err, serr)
	}
	release()
	c.allReadyExcept(outsider)

	// The leader shuts down: it says so; the others elect a new one and
	// are ready again.
	ld = c.leader()
	for i, nd := range c.nodes {
		if nd == ld {
			c.shutdown(i)
		}
	}
	if err := ld.Ready(); !errors.Is(err, ErrClosed) || !strings.Contains(err.Error(), "shut down") {
		t.Fatalf("a shut down node: %v, want ErrClosed", err)
	}
	c.allReadyExcept(outsider)
	if _, err := c.leader().Apply(t.Context(), ledger.Sweep{Now: w.now}); err != nil {
		t.Fatal(err)
	}
}

// allReadyExcept polls until every live node but skip is Ready.
func (c *testCluster) allReadyExcept(skip *Node) {
	c.t.Helper()
	for i, nd := range c.nodes {
		if c.down[i] || nd == skip {
			continue
		}
		pollUntil(c.t, fmt.Sprintf("%s ready", nd.ID()), func() bool { return nd.Ready() == nil })
	}
}
