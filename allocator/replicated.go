package allocator

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sync"

	"github.com/hashicorp/raft"

	"github.com/rationhq/ration/allocator/cluster"
	"github.com/rationhq/ration/allocator/ledger"
	"github.com/rationhq/ration/bucket"
)

// ClusterConfig says how a replicated Ledger (NewReplicated) runs its
// raft node.
type ClusterConfig struct {
	// ID is this member's raft server id.
	ID raft.ServerID
	// Transport carries raft's traffic: raft.NewInmemTransport in tests,
	// a raft.NetworkTransport between processes.
	Transport raft.Transport
	// APIURLs maps each member's raft server id to its lease API base URL
	// ("http://host:port" or "https://host:port"), which a member that is
	// not the leader names in its NOT_LEADER answers. A leader missing
	// from it is answered without the URL, as while no leader is known.
	APIURLs map[raft.ServerID]string
	// Node configures the node (cluster.WithBoltStore,
	// cluster.WithFileSnapshots, cluster.WithRaftConfig, ...). Its logger
	// defaults to the Ledger's (WithLogger).
	Node []cluster.Option
}

// NewReplicated returns a Ledger that is one member of a raft cluster:
// its state is the replicated ledger (package cluster) and every call is
// applied through the log. Only the leader applies calls; a member that
// is not the leader answers each with a *NotLeaderError naming the
// leader's API URL. The leader stamps each log entry with its clock
// (WithClock) and groups the calls that arrive while an entry is in
// flight into the next one (as the journal's group commit does, with the
// same linger, WithCommitLinger); a call is answered once its entry is
// committed by a majority and applied on this member.
//
// The ledger options (TTL, strict mode, policies, retention) must be the
// same on every member: they are the state machine's configuration.
// WithCommitObserver and the durable store's options do not apply; the
// node's stores come from cc.Node (memory by default: nothing survives
// the process). A new cluster is formed with Node().Bootstrap on one
// member. Close shuts the node down.
func NewReplicated(cc ClusterConfig, opts ...Option) (*Ledger, error) {
	l, err := configured(opts)
	if err != nil {
		return nil, err
	}
	nodeOpts := append([]cluster.Option{cluster.WithLogger(l.cfg.logger)}, cc.Node...)
	node, err := cluster.New(cc.ID, cc.Transport, l.cfg.ledgerConfig(), nodeOpts...)
	if err != nil {
		return nil, err
	}
	r := &replicated{node: node, urls: maps.Clone(cc.APIURLs), now: l.now}
	r.gc = newGroupCommit(l.cfg.linger, r.flush)
	l.rep = r
	return l, nil
}

// Node returns the raft node of a replicated Ledger (NewReplicated), for
// bootstrapping, readiness, metrics and membership; nil for a Ledger of
// one process (New, Open).
func (l *Ledger) Node() *cluster.Node {
	if l.rep == nil {
		return nil
	}
	return l.rep.node
}

// maxEntryCalls bounds the calls grouped into one log entry, so that an
// entry stays a few megabytes at most even when every call carries many
// keys; the calls left over go into the next entry.
const maxEntryCalls = 256

// replicated is a Ledger's cluster path. A call validates its input, joins
// the queue and waits on the group commit, whose flush proposes what is
// queued as one entry.
type replicated struct {
	node *cluster.Node
	urls map[raft.ServerID]string // read-only after NewReplicated
	now  func() bucket.Instant    // the Ledger's clock
	gc   *groupCommit

	mu       sync.Mutex // guards queue and appended
	queue    []*proposal
	appended uint64 // calls queued so far: the last one's position
}

// proposal is one call in the queue. build makes its command for the
// entry's instant; reply and err are its outcome, written by the flush
// that proposed it before the group commit marks its position done.
type proposal struct {
	build func(now bucket.Instant) ledger.Command
	reply any
	err   error
}

// apply applies the command build makes through the log and returns its
// reply. Bad input is refused here (ledger.Validate, the check the state
// machine makes), so it costs no log entry and never shares one.
func (r *replicated) apply(build func(now bucket.Instant) ledger.Command) (any, error) {
	if err := ledger.Validate(build(0)); err != nil {
		return nil, err
	}
	p := &proposal{build: build}
	r.mu.Lock()
	r.queue = append(r.queue, p)
	r.appended++
	pos := r.appended
	r.mu.Unlock()
	if err := r.gc.wait(pos); err != nil {
		return nil, err // not reached: flush answers every call it takes
	}
	return p.reply, p.err
}

// flush proposes the queued calls (up to maxEntryCalls) as one entry,
// each command at the same instant, the clock's now when it is proposed,
// and hands each call its result. It never fails as a whole: an error
// about the entry (this member is not the leader, the outcome is unknown)
// is every call's error.
func (r *replicated) flush() (uint64, error) {
	r.mu.Lock()
	n := min(len(r.queue), maxEntryCalls)
	batch := r.queue[:n:n]
	r.queue = r.queue[n:]
	end := r.appended - uint64(len(r.queue))
	r.mu.Unlock()
	if n == 0 {
		return end, nil
	}
	now := r.now()
	cmds := make([]ledger.Command, n)
	for i, p := range batch {
		cmds[i] = p.build(now)
	}
	// No deadline: the entry is shared, and raft answers it (committed,
	// leadership lost, or shut down) without one.
	res, err := r.node.ApplyBatch(context.Background(), cmds)
	for i, p := range batch {
		if err != nil {
			p.err = r.wrap(err)
			continue
		}
		p.reply, p.err = res[i].Reply, res[i].Err
	}
	return end, nil
}

// wrap turns the node's errors into the Ledger's: a NotLeaderError with
// the leader's API URL, ErrClosed after Shutdown.
func (r *replicated) wrap(err error) error {
	var nle *cluster.NotLeaderError
	switch {
	case errors.As(err, &nle):
		return &NotLeaderError{Leader: r.urls[nle.LeaderID], Unknown: nle.Unknown}
	case errors.Is(err, cluster.ErrClosed):
		return fmt.Errorf("%w: %w", ErrClosed, err)
	}
	return err
}
