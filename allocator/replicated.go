package allocator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"

	"github.com/rationhq/ration"
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
	// Node configures the node (cluster.WithBoltStore,
	// cluster.WithFileSnapshots, cluster.WithRaftConfig,
	// cluster.WithAPIURLs for the leader's URL in NOT_LEADER answers, ...).
	// Its logger defaults to the Ledger's (WithLogger).
	Node []cluster.Option
}

// Member is a Ledger that is one member of a raft cluster
// (NewReplicated), with its node for the operations on the cluster.
type Member struct {
	*Ledger
	rep *replicated
}

// NewReplicated returns a Ledger that is one member of a raft cluster:
// its state is the replicated ledger (package cluster) and every call is
// applied through the log. Only the leader applies calls; a member that
// is not the leader answers each with a *cluster.NotLeaderError naming
// the leader (and its API URL, cluster.WithAPIURLs). The leader stamps
// each log entry with its clock (WithClock), never with an instant before
// the latest one the ledger applied: while its clock is behind that, it
// waits on it, up to the raft election timeout, and refuses calls with
// ErrClockBehind beyond (nothing applied). It groups the calls that
// arrive while an entry is in flight into the next one (as the journal's
// group commit does, with the same linger, WithCommitLinger); a call is
// answered once its entry is committed by a majority and applied on this
// member.
//
// The ledger options (TTL, strict mode, policies, retention, quota) must
// be the same on every member: they are the state machine's
// configuration. WithCommitObserver, which observes bbolt commits, is an
// error here; the node's stores come from cc.Node (memory by default:
// nothing survives the process). A new cluster is formed with
// Node().Bootstrap on one member. Close shuts the node down.
func NewReplicated(cc ClusterConfig, opts ...Option) (*Member, error) {
	cfg, err := configure(opts, replicatedLedger)
	if err != nil {
		return nil, err
	}
	nodeOpts := append([]cluster.Option{cluster.WithLogger(cfg.logger)}, cc.Node...)
	node, err := cluster.New(cc.ID, cc.Transport, cfg.ledgerConfig(), nodeOpts...)
	if err != nil {
		return nil, err
	}
	r := &replicated{node: node, now: cfg.now, clock: cfg.clock,
		maxBehind: cfg.clockWait, log: cfg.logger, stop: make(chan struct{})}
	if r.maxBehind == 0 {
		r.maxBehind = node.Raft().ReloadableConfig().ElectionTimeout
	}
	r.gc = newGroupCommit(cfg.linger, r.flush)
	return &Member{Ledger: &Ledger{cfg: cfg, store: r}, rep: r}, nil
}

// Node returns the member's raft node, for bootstrapping, readiness,
// metrics and membership.
func (m *Member) Node() *cluster.Node { return m.rep.node }

// maxEntryCalls and maxEntryKeys bound the calls, and their keys, grouped
// into one log entry, so that an entry encodes within cluster.MaxEntryBytes
// even when every call carries many keys (TestEntryFitsMaxEntryBytes); the
// calls left over go into the next entry. A call alone is never over
// them: it carries at most ration.MaxBatch keys.
const (
	maxEntryCalls = 256
	maxEntryKeys  = 4 * ration.MaxBatch
)

// replicated is a Ledger's cluster path. A call validates its input, joins
// the queue and waits on the group commit, whose flush proposes what is
// queued as one entry.
type replicated struct {
	node   *cluster.Node
	now    func() bucket.Instant // the Ledger's clock, as an instant
	clock  ration.Clock          // the same clock, to wait on
	gc     *groupCommit
	log    *slog.Logger
	stop   chan struct{} // closed by close: a wait for the clock ends
	closed atomic.Bool

	// maxBehind is the longest a leader waits for its clock to reach the
	// latest Now its ledger applied before it proposes (see stamp).
	maxBehind time.Duration
	// behind: the last stamp found the clock behind (for logging the
	// change only). Written by flush, which runs on one goroutine at a time.
	behind bool

	mu       sync.Mutex // guards queue and appended
	queue    []*proposal
	appended uint64 // calls queued so far: the last one's position
}

// proposal is one call in the queue. build makes its command for the
// entry's instant; reply and err are its outcome, written by the flush
// that proposed it before the group commit marks its position done.
// taken and dropped are guarded by replicated.mu: a flush takes a
// proposal (taken), unless its caller gave up first (dropped), which
// a flush then skips.
type proposal struct {
	build          func(now bucket.Instant) ledger.Command
	keys           int // the keys its command carries
	taken, dropped bool
	reply          any
	err            error
}

// apply applies the command build makes through the log and returns its
// reply. Bad input is refused here (ledger.Validate, the check the state
// machine makes, at the clock's now: the entry's instant is no earlier), so
// it costs no log entry and never shares one; so is a call the state would
// refuse for its spender id or its credential's quota (FSM.Admit, against
// this member's applied state: the state machine checks again). If ctx
// ends before a flush takes the call, the call is dropped (not applied);
// after, its outcome is unknown.
func (r *replicated) apply(ctx context.Context, build func(now bucket.Instant) ledger.Command) (any, error) {
	if r.closed.Load() {
		return nil, ErrClosed
	}
	cmd := build(r.now())
	if err := ledger.Validate(cmd); err != nil {
		return nil, err
	}
	if err := r.node.FSM().Admit(cmd); errors.Is(err, ledger.ErrForeignSpender) || errors.Is(err, ledger.ErrResourceExhausted) {
		return nil, err
	}
	p := &proposal{build: build, keys: keysOf(cmd)}
	r.mu.Lock()
	r.queue = append(r.queue, p)
	r.appended++
	pos := r.appended
	r.mu.Unlock()
	if err := r.gc.wait(ctx, pos); err != nil {
		if err != ctx.Err() {
			return nil, err // not reached: flush answers every call it takes
		}
		r.mu.Lock()
		taken := p.taken
		p.dropped = !taken
		r.mu.Unlock()
		return nil, &AbandonedError{Err: err, Unknown: taken}
	}
	return p.reply, p.err
}

// flush proposes the queued calls (up to maxEntryCalls and maxEntryKeys)
// as one entry,
// each command at the same instant, the clock's now when it is proposed,
// and hands each call its result. It never fails as a whole: an error
// about the entry (this member is not the leader, the outcome is unknown)
// is every call's error.
func (r *replicated) flush() (uint64, error) {
	r.mu.Lock()
	n, keys := 0, 0
	for ; n < min(len(r.queue), maxEntryCalls); n++ {
		if keys += r.queue[n].keys; n > 0 && keys > maxEntryKeys {
			break
		}
	}
	batch := make([]*proposal, 0, n)
	for _, p := range r.queue[:n] {
		if !p.dropped {
			p.taken = true
			batch = append(batch, p)
		}
	}
	r.queue = r.queue[n:]
	end := r.appended - uint64(len(r.queue))
	r.mu.Unlock()
	if len(batch) == 0 {
		return end, nil
	}
	now, err := r.stamp()
	if err != nil {
		for _, p := range batch {
			p.err = err
		}
		return end, nil
	}
	cmds := make([]ledger.Command, len(batch))
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

// stamp returns the instant for the next entry: the clock's now, once it
// is not behind the latest Now this member's ledger applied. Applied time
// never goes back (the FSM raises an earlier Now to that instant), and a
// reply's durations (Wait, RetryAfter) count from the applied instant; so
// a leader whose clock is behind it, stamping its own now, would hand out
// waits that end early by the difference on its clock, the one its
// callers share. It waits on its clock instead, up to maxBehind in all
// (the raft election timeout unless set: a stall no longer than a
// failover, which spenders already ride through on their leases), and
// beyond that refuses with ErrClockBehind, having proposed nothing.
func (r *replicated) stamp() (bucket.Instant, error) {
	floor, err := r.node.AppliedNow(context.Background())
	if err != nil {
		return 0, r.wrap(err)
	}
	var waited time.Duration
	for {
		now := r.now()
		if now >= floor {
			if r.behind {
				r.behind = false
				r.log.Info("allocator: the clock has passed the ledger's latest instant; proposing again", "waited", waited)
			}
			return now, nil
		}
		d := floor.Sub(now)
		if !r.behind {
			r.behind = true
			r.log.Warn("allocator: this leader's clock is behind the latest instant the ledger applied; calls wait for it up to max_wait, and are refused beyond",
				"behind", d, "max_wait", r.maxBehind)
		}
		if waited+d > r.maxBehind {
			return 0, fmt.Errorf("%w by %v (a leader waits %v at most)", ErrClockBehind, d, r.maxBehind)
		}
		ch := make(chan struct{})
		t := r.clock.AfterFunc(d, func() { close(ch) })
		select {
		case <-ch:
		case <-r.stop:
			t.Stop()
			return 0, ErrClosed
		}
		waited += d
	}
}

// keysOf is the number of keys cmd carries.
func keysOf(cmd ledger.Command) int {
	switch c := cmd.(type) {
	case ledger.Acquire:
		return len(c.Keys)
	case ledger.ReserveAhead:
		return len(c.Keys)
	case ledger.Release:
		return len(c.Keys)
	}
	return 0
}

func (r *replicated) stats() ledger.Stats { return r.node.FSM().Stats() }

// close ends a wait for the clock and shuts the node down (calls in
// flight get cluster.ErrOutcomeUnknown).
func (r *replicated) close() error {
	if !r.closed.CompareAndSwap(false, true) {
		return nil
	}
	close(r.stop)
	return r.node.Shutdown()
}

// wrap marks the node's ErrClosed (after Shutdown) as the Ledger's.
func (r *replicated) wrap(err error) error {
	if errors.Is(err, cluster.ErrClosed) {
		return fmt.Errorf("%w: %w", ErrClosed, err)
	}
	return err
}

// RestoreBackup replaces the state of the member's cluster with a backup
// (cluster.Node.RestoreBackup), on the leader. It refuses, before
// anything changes, a backup whose latest instant is ahead of this
// member's clock by more than a leader waits for its clock (the raft
// election timeout unless set): no call could be stamped until then.
func (m *Member) RestoreBackup(ctx context.Context, b []byte) error {
	return m.rep.node.RestoreBackup(ctx, b, m.rep.now(), m.rep.maxBehind)
}
