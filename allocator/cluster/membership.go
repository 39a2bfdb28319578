package cluster

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/hashicorp/raft"
)

// ErrMembership is wrapped by the error of AddMember or RemoveMember when
// the change is refused for what it would do to the cluster (the last
// voter removed, no quorum of reachable voters left, an id or address
// already taken): nothing changed.
var ErrMembership = errors.New("cluster: membership change refused")

// ErrNotMember is wrapped by RemoveMember's error for an id that is not a
// member.
var ErrNotMember = errors.New("cluster: not a member")

// ErrNotCaughtUp is wrapped by AddMember's error when the new member was
// added as a non-voter but its log did not reach the leader's in time: it
// stays a non-voter (raft goes on replicating to it); AddMember again
// promotes it once it has.
var ErrNotCaughtUp = errors.New("cluster: the new member has not caught up")

// PeerProgress says what a member's answers to this one showed last: a
// StreamLayer (StreamLayer.Progress).
type PeerProgress interface {
	Progress(addr raft.ServerAddress) (Contact, bool)
}

// catchUpPoll is how often AddMember looks at the new member's progress.
const catchUpPoll = 20 * time.Millisecond

// answerElections is how many election timeouts AddMember waits for a new
// member's first answer before it removes it again.
const answerElections = 10

// quorumWait is the least a membership change waits for the voters'
// answers (two election timeouts if longer): on a loaded machine a
// heartbeat can be late, and a refusal costs the operator only the wait.
const quorumWait = time.Second

// AddMember adds the member id at addr, on the leader, without risking
// the cluster's quorum: as a non-voter first (raft replicates the log to
// it, and its vote does not count), then, once its answers (p) show its
// log reaching the leader's commit index at the time it was added, as a
// voter. It refuses (ErrMembership, nothing changed) an id that is a
// member at another address, an address another member has, and a
// promotion after which the voters reachable from the leader (answering
// it now: quorumAfter) would be fewer than a quorum. A member that
// has not answered within answerElections election timeouts is removed
// again (ErrNotCaughtUp); one that answered but has not caught up when
// ctx ends stays a non-voter (ErrNotCaughtUp). An id already a voter at addr is
// done. Not the leader: a *NotLeaderError.
func (n *Node) AddMember(ctx context.Context, id raft.ServerID, addr raft.ServerAddress, p PeerProgress) error {
	if err := n.leading(); err != nil {
		return err
	}
	servers, err := n.Members()
	if err != nil {
		return err
	}
	voter := false
	for _, s := range servers {
		switch {
		case s.ID == id && s.Address != addr:
			return fmt.Errorf("%w: %s is a member at %s already; remove it first", ErrMembership, id, s.Address)
		case s.ID != id && s.Address == addr:
			return fmt.Errorf("%w: %s is member %s's address", ErrMembership, addr, s.ID)
		case s.ID == id:
			voter = s.Suffrage == raft.Voter
		}
	}
	if voter {
		return nil
	}
	if err := n.quorumAfter(ctx, servers, p, id, true); err != nil {
		return err
	}
	f := n.raft.AddNonvoter(id, addr, 0, timeout(ctx))
	if err := n.wait(ctx, f); err != nil {
		return err
	}
	target, added := f.Index(), time.Now()
	answerWithin := answerElections * n.raft.ReloadableConfig().ElectionTimeout
	for {
		c, answered := p.Progress(addr)
		if answered && c.LastLog >= target && n.fresh(c) {
			break
		}
		if !answered && time.Since(added) > answerWithin {
			n.log.Warn("cluster: a member added never answered; removing it again", "id", id, "address", addr, "waited", answerWithin)
			if err := n.wait(context.WithoutCancel(ctx), n.raft.RemoveServer(id, 0, time.Minute)); err != nil {
				return fmt.Errorf("%w: %s at %s never answered, and removing it again failed: %w", ErrNotCaughtUp, id, addr, err)
			}
			return fmt.Errorf("%w: %s at %s never answered within %v (unreachable, or it refused this member); removed again", ErrNotCaughtUp, id, addr, answerWithin)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w: %s's log has not reached index %d; it stays a non-voter (add it again to promote it once it has)", ErrNotCaughtUp, id, target)
		case <-time.After(catchUpPoll):
		}
	}
	servers, err = n.Members()
	if err != nil {
		return err
	}
	if err := n.quorumAfter(ctx, servers, p, id, true); err != nil {
		return err
	}
	return n.wait(ctx, n.raft.AddVoter(id, addr, 0, timeout(ctx)))
}

// RemoveMember removes the member id, on the leader. It refuses
// (ErrMembership, nothing changed) to remove the last voter, and a
// removal after which the voters reachable from the leader would be fewer
// than a quorum of those left. Not a member: ErrNotMember. Not the
// leader: a *NotLeaderError.
func (n *Node) RemoveMember(ctx context.Context, id raft.ServerID, p PeerProgress) error {
	if err := n.leading(); err != nil {
		return err
	}
	servers, err := n.Members()
	if err != nil {
		return err
	}
	found := false
	for _, s := range servers {
		found = found || s.ID == id
	}
	if !found {
		return fmt.Errorf("%w: %q", ErrNotMember, id)
	}
	if err := n.quorumAfter(ctx, servers, p, id, false); err != nil {
		return err
	}
	return n.wait(ctx, n.raft.RemoveServer(id, 0, timeout(ctx)))
}

// quorumAfter checks the voters after id is made a voter (add) or removed
// (not add): at least one, and a quorum of them reachable: this leader,
// the new member, and every other voter that answers this leader (p)
// after the check begins, so that a member that just died, whose last
// answer is still recent, does not count. It waits for those answers up
// to quorumWait (raft heartbeats each follower ten times an election
// timeout).
func (n *Node) quorumAfter(ctx context.Context, servers []raft.Server, p PeerProgress, id raft.ServerID, add bool) error {
	since := time.Now()
	deadline := since.Add(max(2*n.raft.ReloadableConfig().ElectionTimeout, quorumWait))
	for {
		voters, reachable := 0, 0
		for _, s := range servers {
			if s.Suffrage != raft.Voter || s.ID == id {
				continue
			}
			voters++
			if c, ok := p.Progress(s.Address); s.ID == n.id || ok && c.At.After(since) {
				reachable++
			}
		}
		if add {
			voters++
			reachable++
		}
		quorum := voters/2 + 1
		switch {
		case voters == 0:
			return fmt.Errorf("%w: %s is the last voter; a cluster needs one", ErrMembership, id)
		case reachable >= quorum:
			return nil
		case time.Now().After(deadline) || ctx.Err() != nil:
			return fmt.Errorf("%w: it would leave %d of %d voters reachable from the leader, fewer than the quorum of %d", ErrMembership, reachable, voters, quorum)
		}
		select {
		case <-ctx.Done():
		case <-time.After(catchUpPoll):
		}
	}
}

// leading returns a *NotLeaderError unless this node leads.
func (n *Node) leading() error {
	if n.IsLeader() {
		return nil
	}
	return n.notLeader(false)
}

// notLeader is this node's NotLeaderError, naming the leader it knows;
// unknown: the entry in question was proposed and may still be applied.
func (n *Node) notLeader(unknown bool) *NotLeaderError {
	addr, id := n.raft.LeaderWithID()
	return &NotLeaderError{Leader: addr, LeaderID: id, URL: n.urls[id], Unknown: unknown}
}

// fresh reports whether c is an answer within the election timeout.
func (n *Node) fresh(c Contact) bool {
	return time.Since(c.At) <= n.raft.ReloadableConfig().ElectionTimeout
}
