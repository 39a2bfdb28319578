package cluster

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/hashicorp/raft"
)

// suffrage returns the leader's configuration as id -> voter.
func suffrage(t *testing.T, c *testCluster) map[raft.ServerID]bool {
	t.Helper()
	servers, err := c.leader().Members()
	if err != nil {
		t.Fatal(err)
	}
	out := map[raft.ServerID]bool{}
	for _, s := range servers {
		out[s.ID] = s.Suffrage == raft.Voter
	}
	return out
}

// TestMembershipKeepsAQuorum: a member is added as a non-voter and
// promoted once its log has caught up; one that never answers is removed
// again; an id or address already taken is refused; a removal that would
// leave fewer reachable voters than a quorum, or no voter, is refused
// with the reason, and nothing changes.
func TestMembershipKeepsAQuorum(t *testing.T) {
	w := newWorkload(t)
	// tcpRaft's timeouts: an election under a loaded machine's -race run
	// would fail a membership change midway (the case tested is the
	// change, not the election).
	c := newCluster(t, 3, tcpRaft)
	w.run(c, 30, 3)
	ctx, cancel := context.WithTimeout(t.Context(), waitFor)
	defer cancel()

	fresh := c.add()
	if err := c.leader().AddMember(ctx, fresh.ID(), fresh.Addr(), c); err != nil {
		t.Fatal(err)
	}
	if s := suffrage(t, c); len(s) != 4 || !s[fresh.ID()] {
		t.Fatalf("after adding %s: %v", fresh.ID(), s)
	}
	if i, last := fresh.FSM().AppliedIndex(), c.leader().Raft().CommitIndex(); last-i > ReadyLag {
		t.Fatalf("promoted with its log at %d of %d", i, last)
	}
	if err := c.leader().AddMember(ctx, fresh.ID(), fresh.Addr(), c); err != nil {
		t.Fatalf("adding a voter again: %v, want nothing to do", err)
	}

	for _, tc := range []struct {
		name   string
		id     raft.ServerID
		addr   raft.ServerAddress
		reason string
	}{
		{"an id at another address", fresh.ID(), "elsewhere:7451", "is a member at mem3 already"},
		{"another member's address", "x", fresh.Addr(), "is member n3's address"},
	} {
		before := suffrage(t, c)
		if err := c.leader().AddMember(ctx, tc.id, tc.addr, c); !errors.Is(err, ErrMembership) || !strings.Contains(err.Error(), tc.reason) {
			t.Fatalf("%s: %v, want ErrMembership saying %q", tc.name, err, tc.reason)
		}
		if after := suffrage(t, c); len(after) != len(before) {
			t.Fatalf("%s changed the membership: %v", tc.name, after)
		}
	}
	err := c.leader().AddMember(ctx, "ghost", "nowhere:7451", c)
	if !errors.Is(err, ErrNotCaughtUp) || !strings.Contains(err.Error(), "never answered") || !strings.HasSuffix(err.Error(), "removed again") {
		t.Fatalf("adding an unreachable member: %v", err)
	}
	if s := suffrage(t, c); len(s) != 4 {
		t.Fatalf("the unreachable member was not removed again: %v", s)
	}

	// Four voters: remove one while all answer, then shut another down.
	lead := c.leader()
	var followers []int
	for i, nd := range c.nodes {
		if nd != lead && !c.down[i] {
			followers = append(followers, i)
		}
	}
	if err := lead.RemoveMember(ctx, c.nodes[followers[0]].ID(), c); err != nil {
		t.Fatal(err)
	}
	c.shutdown(followers[1]) // three voters, two reachable
	dead := c.nodes[followers[1]].ID()
	live := c.nodes[followers[2]].ID()
	before := suffrage(t, c)
	if err := lead.RemoveMember(ctx, live, c); !errors.Is(err, ErrMembership) || !strings.Contains(err.Error(), "1 of 2 voters reachable") {
		t.Fatalf("removing a live voter with another down: %v", err)
	}
	if err := lead.RemoveMember(ctx, "nobody", c); !errors.Is(err, ErrNotMember) {
		t.Fatalf("removing a non-member: %v", err)
	}
	if after := suffrage(t, c); len(after) != len(before) {
		t.Fatalf("a refused removal changed the membership: %v", after)
	}
	if err := lead.RemoveMember(ctx, dead, c); err != nil {
		t.Fatalf("removing the dead voter: %v", err)
	}
	if err := lead.RemoveMember(ctx, live, c); err != nil {
		t.Fatalf("removing a live voter, all others reachable: %v", err)
	}
	if err := c.leader().RemoveMember(ctx, c.leader().ID(), c); !errors.Is(err, ErrMembership) || !strings.Contains(err.Error(), "last voter") {
		t.Fatalf("removing the last voter: %v", err)
	}
	w.run(c, 5, 1) // the one-voter cluster serves
}
