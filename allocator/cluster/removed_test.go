package cluster

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

// A removed node says so in Ready (and so is unready for good): a
// follower once the change reaches it; a leader that removes itself once
// the change commits (raft then shuts it down: ErrRemoved, not
// ErrClosed); a removed node restarted on its stores, which holds a
// configuration without itself and hears from no leader, after
// removedGrace election timeouts. A node waiting to be added (no
// configuration) never counts as removed, and the members left serve.
func TestRemovedNodeKnowsIt(t *testing.T) {
	const timeout = 200 * time.Millisecond // long enough that a loaded machine seldom deposes a leader
	c := newCluster(t, 3, func(rc *raft.Config) {
		rc.HeartbeatTimeout, rc.ElectionTimeout, rc.LeaderLeaseTimeout = timeout, timeout, timeout
	})
	waiting := c.add() // started, never added
	c.allReadyExcept(waiting)
	index := func(nd *Node) int {
		for i := range c.nodes {
			if c.nodes[i] == nd {
				return i
			}
		}
		return -1
	}
	// The removal reaches a follower only if it holds the entries before
	// it: the leader stops replicating to it once the entry is appended.
	follower := (index(c.leader()) + 1) % 3
	pollUntil(t, "the follower holds the configuration", func() bool { return inConfiguration(c.nodes[follower]) })
	c.remove(c.nodes[follower].ID())
	pollUntil(t, "the removed follower knows it", func() bool { return errors.Is(c.nodes[follower].Ready(), ErrRemoved) })
	if err := c.nodes[follower].Ready(); err.Error() != "cluster: removed from the cluster" {
		t.Fatalf("the removed follower's Ready: %v", err)
	}

	// The leader removes itself (if another node takes over first, that
	// one is removed through it).
	ld := c.leader()
	c.remove(ld.ID())
	pollUntil(t, "the leader that removed itself knows it", func() bool { return errors.Is(ld.Ready(), ErrRemoved) })
	last := 3 - follower - index(ld)
	pollUntil(t, "the last member leads", func() bool { return c.nodes[last].IsLeader() && c.nodes[last].Ready() == nil })

	c.shutdown(follower)
	restarted := time.Now()
	c.restart(follower)
	pollUntil(t, "the removed follower, restarted, knows it", func() bool { return errors.Is(c.nodes[follower].Ready(), ErrRemoved) })
	if grace := removedGrace * timeout; time.Since(restarted) < grace {
		t.Fatalf("removed %v after the restart, before the grace of %v", time.Since(restarted), grace)
	}
	if err := waiting.Ready(); !errors.Is(err, ErrNoLeader) {
		t.Fatalf("a node waiting to be added, %v after its start: %v, want ErrNoLeader", time.Since(restarted), err)
	}
}

// remove removes id at the leader, again at the new leader after a
// leadership change (where the first removal committed, the second finds
// no such member).
func (c *testCluster) remove(id raft.ServerID) {
	c.t.Helper()
	for deadline := time.Now().Add(waitFor); ; {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		err := c.leader().RemoveMember(ctx, id, c)
		cancel()
		if err == nil || errors.Is(err, ErrNotMember) {
			return
		}
		if !errors.Is(err, ErrNotLeader) && !errors.Is(err, ErrOutcomeUnknown) || time.Now().After(deadline) {
			c.t.Fatalf("remove %s: %v", id, err)
		}
	}
}

// inConfiguration reports whether nd holds a configuration with itself,
// after a call of Ready that sees it so.
func inConfiguration(nd *Node) bool {
	for _, s := range nd.Raft().GetConfiguration().Configuration().Servers {
		if s.ID == nd.ID() {
			return nd.Ready() == nil
		}
	}
	return false
}
