package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"

	"github.com/rationhq/ration/allocator/ledger"
	"github.com/rationhq/ration/bucket"
	"github.com/rationhq/ration/internal/boltcheck"
)

// ErrNotLeader is wrapped by a *NotLeaderError: the node is not the
// leader, so it cannot apply a command.
var ErrNotLeader = errors.New("cluster: not the leader")

// ErrOutcomeUnknown is wrapped by an error of Apply when the entry was
// proposed but the node could not learn whether it was committed: the
// leader lost its leadership, the node shut down, or the context ended
// while waiting. The command may yet be applied. A ledger call is
// exactly-once per (spender, epoch, sequence), so the caller retries the
// same call, with the same body, at the leader: it gets the stored reply
// if the first attempt was applied, and is applied once otherwise.
var ErrOutcomeUnknown = errors.New("cluster: outcome unknown")

// ErrClosed is returned by Apply after Shutdown.
var ErrClosed = errors.New("cluster: node shut down")

// ErrNoLeader is wrapped by Ready's error when the node knows no leader
// (an election is under way, or the node is cut off or not a member).
var ErrNoLeader = errors.New("cluster: no leader known")

// ErrRemoved is wrapped by Ready's error once the node has learned that
// it was removed from the cluster (see Node.Ready). It does not serve
// again: its process should stop.
var ErrRemoved = errors.New("cluster: removed from the cluster")

// ErrCatchingUp is wrapped by Ready's error when a follower has more than
// ReadyLag committed entries left to apply.
var ErrCatchingUp = errors.New("cluster: catching up")

// ErrStoreFailing is wrapped by Ready's error when the node's last write
// to its raft store failed (a full disk): it cannot take its part until a
// write succeeds again.
var ErrStoreFailing = errors.New("cluster: the raft store's last write failed")

// ReadyLag is how many committed entries a follower may have left to
// apply and still be ready. It is more than zero because a follower
// learns of commits a heartbeat late, and because raft gives the FSM
// neither the no-op a new leader appends nor configuration entries: they
// count as not applied until the next command is.
const ReadyLag = 16

// NotLeaderError says the node is not (or no longer) the leader, and who
// the leader is when the node knows. It wraps ErrNotLeader, and also
// ErrOutcomeUnknown when Unknown is set. The allocator answers it as the
// lease protocol's NOT_LEADER, naming URL.
type NotLeaderError struct {
	Leader   raft.ServerAddress // "" when unknown
	LeaderID raft.ServerID      // "" when unknown
	// URL is the leader's lease API base URL (WithAPIURLs), "" when the
	// leader or its URL is unknown.
	URL string
	// Unknown: the entry was proposed and may still be applied.
	Unknown bool
}

// Error returns "cluster: not the leader (leader <id> at <addr>)".
func (e *NotLeaderError) Error() string {
	s := ErrNotLeader.Error()
	if e.Leader != "" {
		s += fmt.Sprintf(" (leader %s at %s)", e.LeaderID, e.Leader)
	} else {
		s += " (leader unknown)"
	}
	if e.Unknown {
		s += "; the entry may still be applied"
	}
	return s
}

// Unwrap returns ErrNotLeader, and ErrOutcomeUnknown when Unknown.
func (e *NotLeaderError) Unwrap() []error {
	if e.Unknown {
		return []error{ErrNotLeader, ErrOutcomeUnknown}
	}
	return []error{ErrNotLeader}
}

// Option configures a Node.
type Option func(*options)

type options struct {
	forceNew  []raft.Server // WithForceNew's configuration; nil: not forced
	logs      raft.LogStore
	stable    raft.StableStore
	boltPath  string
	snaps     raft.SnapshotStore
	snapDir   string
	snapKeep  int
	tune      []func(*raft.Config)
	logger    *slog.Logger
	localAddr raft.ServerAddress
	urls      map[raft.ServerID]string
}

// WithBoltStore keeps the raft log and stable state in a bbolt file at
// path (raft-boltdb, fsync on), which the Node closes at Shutdown.
func WithBoltStore(path string) Option { return func(o *options) { o.boltPath = path } }

// WithForceNew lets a member start whose raft log and state (WithBoltStore)
// are gone while its data directory shows it was a member (snapshots, or
// the marker a member leaves beside its raft store), which New otherwise
// refuses (ErrLostState): with snapshots it forms a new cluster of servers
// from the latest one (raft's RecoverCluster: its state, a new
// configuration), without them it starts empty. It is for disaster
// recovery, once: New refuses it for a member whose raft state is there.
func WithForceNew(servers []raft.Server) Option {
	return func(o *options) { o.forceNew = servers }
}

// WithStores uses the given log and stable stores (the caller owns them).
// The default, without this or WithBoltStore, keeps both in memory:
// nothing survives the process.
func WithStores(logs raft.LogStore, stable raft.StableStore) Option {
	return func(o *options) { o.logs, o.stable = logs, stable }
}

// WithFileSnapshots keeps snapshots in dir, retaining the latest retain
// (at least 1). The default keeps the latest snapshot in memory.
func WithFileSnapshots(dir string, retain int) Option {
	return func(o *options) { o.snapDir, o.snapKeep = dir, max(retain, 1) }
}

// WithSnapshotStore uses the given snapshot store.
func WithSnapshotStore(s raft.SnapshotStore) Option { return func(o *options) { o.snaps = s } }

// WithRaftConfig lets f adjust raft's configuration (timeouts, snapshot
// threshold and interval, trailing logs) after the defaults are set;
// LocalID and Logger are the Node's, and MaxAppendEntries at most 8 (what
// a StreamLayer accepts in one request).
func WithRaftConfig(f func(*raft.Config)) Option {
	return func(o *options) { o.tune = append(o.tune, f) }
}

// WithAPIURLs maps each member's raft server id to its lease API base
// URL ("http://host:port" or "https://host:port"), which a NotLeaderError
// names as the leader's URL. A leader missing from it is named without.
func WithAPIURLs(urls map[raft.ServerID]string) Option {
	return func(o *options) { o.urls = maps.Clone(urls) }
}

// WithLogger sends the Node's and raft's logs to l (default: discarded).
func WithLogger(l *slog.Logger) Option { return func(o *options) { o.logger = l } }

// Node is one replica of the ledger: a raft member whose FSM is the
// ledger's state. Commands go through Apply on the leader. A Node is safe
// for concurrent use.
type Node struct {
	id    raft.ServerID
	trans raft.Transport
	raft  *raft.Raft
	fsm   *FSM
	log   *slog.Logger
	urls  map[raft.ServerID]string // WithAPIURLs; read-only
	bolt  io.Closer                // the store WithBoltStore opened, or nil
	store *watchedStore
	// marker is the file that says the data directory held a member's
	// raft state (WithBoltStore's), or "".
	marker string

	observer      *raft.Observer
	leaderChanges atomic.Uint64 // leader observations naming a leader
	barrierTerm   atomic.Uint64 // the last term in which AppliedNow's barrier completed
	// started is when the node started, on the wall clock raft times its
	// contacts with: a follower that never heard from a leader reports its
	// last contact as the time since.
	started time.Time

	// member is set once the node has seen itself in the configuration;
	// removed, once it has learned that it was removed (see Ready).
	member, removed atomic.Bool

	mu     sync.Mutex
	closed bool

	// stopped is closed once Shutdown has stopped raft: a future raft has
	// not answered by then it never will (see wait).
	stopped chan struct{}
}

// New starts a Node with the given id on trans, holding a ledger under
// cfg (the same on every replica). A new cluster is formed by calling
// Bootstrap on one node (or all, with the same servers); a node with
// existing raft state resumes it.
func New(id raft.ServerID, trans raft.Transport, cfg ledger.Config, opts ...Option) (*Node, error) {
	if id == "" || trans == nil {
		return nil, errors.New("cluster: a node needs an id and a transport")
	}
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	if o.logger == nil {
		o.logger = slog.New(slog.DiscardHandler)
	}
	lg := o.logger.With("node", string(id))
	hl := newHclog(lg)
	fsm, err := NewFSM(cfg)
	if err != nil {
		return nil, err
	}
	n := &Node{id: id, trans: trans, fsm: fsm, log: lg, urls: o.urls, started: time.Now(), stopped: make(chan struct{})}
	switch {
	case o.boltPath != "":
		n.marker = filepath.Join(filepath.Dir(o.boltPath), memberMarker)
		if err := boltcheck.Check(o.boltPath, 5*time.Second); err != nil {
			return nil, fmt.Errorf("cluster: raft store refused: %w", err)
		}
		bs, err := raftboltdb.NewBoltStore(o.boltPath)
		if err != nil {
			return nil, fmt.Errorf("cluster: open raft store: %w", err)
		}
		n.bolt = bs
		o.logs, o.stable = bs, bs
	case o.logs == nil || o.stable == nil:
		mem := raft.NewInmemStore()
		o.logs, o.stable = mem, mem
	}
	n.store = &watchedStore{LogStore: o.logs, StableStore: o.stable}
	o.logs, o.stable = n.store, n.store
	switch {
	case o.snaps != nil:
	case o.snapDir != "":
		fs, err := raft.NewFileSnapshotStoreWithLogger(o.snapDir, o.snapKeep, hl)
		if err != nil {
			n.closeStore()
			return nil, fmt.Errorf("cluster: snapshot store: %w", err)
		}
		o.snaps = fs
	default:
		o.snaps = raft.NewInmemSnapshotStore()
	}
	rc := raft.DefaultConfig()
	for _, f := range o.tune {
		f(rc)
	}
	rc.LocalID = id
	rc.Logger = hl
	// A stream layer refuses an AppendEntries over maxAppendFrame, which
	// allows this many entries.
	rc.MaxAppendEntries = min(rc.MaxAppendEntries, maxAppendEntries)
	if err := n.checkState(&o, rc, cfg); err != nil {
		n.closeStore()
		return nil, err
	}
	r, err := startRaft(rc, fsm, &o, trans)
	if err != nil {
		n.closeStore()
		return nil, err
	}
	n.raft = r
	hl.peers.setRaft(r)
	// The filter runs on raft's goroutine for each observation and sends
	// none (the channel is nil): it counts leader changes, and tells the
	// peer log when a peer answers again or the role changes, without a
	// goroutine of our own. raft observes a leader each time the one it
	// knows changes, to none when an election starts.
	n.observer = raft.NewObserver(nil, false, func(o *raft.Observation) bool {
		switch d := o.Data.(type) {
		case raft.LeaderObservation:
			if d.LeaderID != "" {
				n.leaderChanges.Add(1)
			}
		case raft.ResumedHeartbeatObservation:
			hl.peers.back(d.PeerID)
		case raft.RaftState:
			hl.peers.reset()
		}
		return false
	})
	r.RegisterObserver(n.observer)
	return n, nil
}

// ErrLostState is wrapped by New's error for a member whose raft log and
// state are empty while its data directory shows it was a member: it
// lost its log and its vote, and would vote again in a term it voted in,
// or a bootstrap would form a second cluster under the same ids.
var ErrLostState = errors.New("cluster: raft state lost")

// memberMarker is the file, beside the raft store, that says this data
// directory held a member's raft state.
const memberMarker = "raft.member"

// checkState refuses to start a member on a raft store that lost its
// state (ErrLostState) unless forced (WithForceNew), and runs the forced
// recovery; it leaves the marker once the member has state.
func (n *Node) checkState(o *options, rc *raft.Config, cfg ledger.Config) error {
	if o.boltPath == "" {
		return nil
	}
	marker := n.marker
	logged, err := raft.HasExistingState(o.logs, o.stable, raft.NewDiscardSnapshotStore())
	if err != nil {
		return fmt.Errorf("cluster: reading the raft store: %w", err)
	}
	snaps, err := o.snaps.List()
	if err != nil {
		return fmt.Errorf("cluster: listing snapshots: %w", err)
	}
	_, statErr := os.Stat(marker)
	marked := statErr == nil
	switch {
	case logged && o.forceNew != nil:
		return fmt.Errorf("cluster: forcing a new cluster, but %s holds this member's raft state: remove the force flag", o.boltPath)
	case logged:
		return n.mark(marker)
	case len(snaps) == 0 && !marked:
		return nil // a new member
	case o.forceNew == nil:
		return fmt.Errorf("%w: %s holds no raft log or vote, but its data directory was a member's (%s): "+
			"restore it from a copy; or remove the data directory and add the member again; or, to form a new cluster from its latest snapshot (disaster recovery), start it once forcing a new cluster",
			ErrLostState, o.boltPath, evidence(snaps, marked))
	case len(snaps) > 0:
		scratch, err := NewFSM(cfg)
		if err != nil {
			return err
		}
		if err := raft.RecoverCluster(rc, scratch, o.logs, o.stable, o.snaps, n.trans, raft.Configuration{Servers: o.forceNew}); err != nil {
			return fmt.Errorf("cluster: forming a new cluster from the latest snapshot: %w", err)
		}
		n.log.Warn("cluster: formed a new cluster from this member's latest snapshot (forced)", "index", snaps[0].Index, "servers", len(o.forceNew))
		return n.mark(marker)
	}
	n.log.Warn("cluster: starting with no raft state although this data directory was a member's (forced)")
	return nil
}

// evidence says what shows a data directory was a member's.
func evidence(snaps []*raft.SnapshotMeta, marked bool) string {
	var parts []string
	if len(snaps) > 0 {
		parts = append(parts, fmt.Sprintf("%d snapshots, the latest at index %d", len(snaps), snaps[0].Index))
	}
	if marked {
		parts = append(parts, "the "+memberMarker+" a member leaves")
	}
	return strings.Join(parts, "; ")
}

// mark leaves the marker that this data directory holds a member's raft
// state.
func (n *Node) mark(path string) error {
	if err := os.WriteFile(path, []byte("this directory holds the raft state of ration cluster member "+string(n.id)+"\n"), 0o600); err != nil {
		return fmt.Errorf("cluster: writing %s: %w", path, err)
	}
	return nil
}

// startRaft starts raft, refusing a raft store whose entries raft cannot
// read: raft panics on a configuration entry that does not decode.
func startRaft(rc *raft.Config, fsm *FSM, o *options, trans raft.Transport) (r *raft.Raft, err error) {
	defer func() {
		if p := recover(); p != nil {
			r, err = nil, fmt.Errorf("cluster: raft store refused: %s holds entries raft cannot read (%v)", o.boltPath, p)
		}
	}()
	r, err = raft.NewRaft(rc, fsm, o.logs, o.stable, o.snaps, trans)
	if err != nil {
		return nil, fmt.Errorf("cluster: start raft: %w", err)
	}
	return r, nil
}

func (n *Node) closeStore() {
	if n.bolt != nil {
		if err := n.bolt.Close(); err != nil {
			n.log.Warn("closing the raft store", "err", err)
		}
	}
}

// ID returns the node's server id.
func (n *Node) ID() raft.ServerID { return n.id }

// Addr returns the node's transport address.
func (n *Node) Addr() raft.ServerAddress { return n.trans.LocalAddr() }

// Raft returns the node's raft instance, for what the Node does not wrap
// (stats, observers, leadership transfer).
func (n *Node) Raft() *raft.Raft { return n.raft }

// FSM returns the node's state machine (for reading its state).
func (n *Node) FSM() *FSM { return n.fsm }

// Bootstrap forms a new cluster of servers (which must include this node).
// It fails with raft.ErrCantBootstrap on a node that has raft state.
func (n *Node) Bootstrap(servers ...raft.Server) error {
	if err := n.raft.BootstrapCluster(raft.Configuration{Servers: servers}).Error(); err != nil {
		return err
	}
	if n.marker != "" {
		return n.mark(n.marker)
	}
	return nil
}

// Leader returns the leader's address and id as this node knows them
// ("" when unknown).
func (n *Node) Leader() (raft.ServerAddress, raft.ServerID) { return n.raft.LeaderWithID() }

// Ready returns nil when the node can take its part: its last write to
// its raft store succeeded, and it is the leader, or a follower that knows
// its leader and whose FSM has applied all but at most ReadyLag of the
// entries it knows are committed. Otherwise it says why: ErrClosed (shut
// down), ErrRemoved, ErrStoreFailing, ErrNoLeader or ErrCatchingUp,
// wrapped with the details. It reads raft's state and the FSM's index
// without waiting for raft or for an Apply in progress.
//
// A node is removed when the configuration it holds is not empty and
// lacks it, it does not lead (a leader that removes itself leads until
// the change commits, then raft shuts it down), and either an earlier
// call saw it in the configuration, or no leader has called on it for
// removedGrace election timeouts (a member removed, then restarted; or
// removed before a call saw it a member). A member being added holds an
// empty configuration until the leader reaches it, and one catching up
// from an older configuration hears from the leader every heartbeat.
// Once removed, it stays so: the leader no longer calls on it.
func (n *Node) Ready() error {
	n.mu.Lock()
	closed := n.closed
	n.mu.Unlock()
	state := n.raft.State()
	failing := n.store.failing()
	switch {
	case closed:
		return ErrClosed
	case n.isRemoved(state):
		return ErrRemoved
	case state == raft.Shutdown:
		return ErrClosed
	case failing != nil:
		return fmt.Errorf("%w: %w", ErrStoreFailing, failing)
	case state == raft.Leader:
		return nil
	}
	addr, id := n.raft.LeaderWithID()
	if addr == "" {
		return fmt.Errorf("%w (%s)", ErrNoLeader, roleName(state))
	}
	commit, applied := n.raft.CommitIndex(), n.fsm.AppliedIndex()
	if commit > applied+ReadyLag {
		return fmt.Errorf("%w %d entries (commit index %d, applied %d; leader %s)", ErrCatchingUp, commit-applied, commit, applied, id)
	}
	return nil
}

// removedGrace is how many election timeouts a node outside the
// configuration it holds, which no call of Ready saw a member, waits for
// a leader to call on it before it counts as removed (see Ready).
const removedGrace = 5

// isRemoved reports whether the node was removed from the cluster (see
// Ready), and records whether it is a member.
func (n *Node) isRemoved(state raft.RaftState) bool {
	if n.removed.Load() {
		return true
	}
	servers := n.raft.GetConfiguration().Configuration().Servers
	for _, s := range servers {
		if s.ID == n.id {
			n.member.Store(true)
			return false
		}
	}
	if len(servers) == 0 || state == raft.Leader {
		return false
	}
	heard := n.raft.LastContact() // zero before any leader called
	if heard.Before(n.started) {
		heard = n.started
	}
	if n.member.Load() || time.Since(heard) > removedGrace*n.raft.ReloadableConfig().ElectionTimeout {
		n.removed.Store(true)
	}
	return n.removed.Load()
}

// IsLeader reports whether this node is the leader.
func (n *Node) IsLeader() bool { return n.raft.State() == raft.Leader }

// Snapshot takes a snapshot now and compacts the log (raft also takes
// them on its own, per SnapshotInterval and SnapshotThreshold).
func (n *Node) Snapshot() error { return n.raft.Snapshot().Error() }

// timeout is ctx's remaining time as raft's enqueue timeout (0: none).
func timeout(ctx context.Context) time.Duration {
	if dl, ok := ctx.Deadline(); ok {
		return max(time.Until(dl), time.Nanosecond)
	}
	return 0
}

// Apply applies cmd through the log and returns its reply (the caller's
// own copy) and error, as ledger.State.Apply gave them on this node once
// the entry was committed by a majority and applied here. On a follower
// it returns a *NotLeaderError, naming the leader when known. See
// ErrOutcomeUnknown for the errors after which the command may still be
// applied.
func (n *Node) Apply(ctx context.Context, cmd ledger.Command) (any, error) {
	res, err := n.ApplyBatch(ctx, []ledger.Command{cmd})
	if err != nil {
		return nil, err
	}
	return res[0].Reply, res[0].Err
}

// ApplyBatch applies cmds, in order, as one log entry (one commit for the
// group) and returns their results, like Apply. The error is about the
// entry (not leader, outcome unknown, encoding); a command's own error is
// in its Result.
func (n *Node) ApplyBatch(ctx context.Context, cmds []ledger.Command) ([]Result, error) {
	b, err := encodeEntry(cmds)
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	n.mu.Lock()
	closed := n.closed
	n.mu.Unlock()
	if closed {
		return nil, ErrClosed
	}
	if err := n.leading(); err != nil {
		return nil, err
	}
	f := n.raft.Apply(b, timeout(ctx))
	if err := n.wait(ctx, f); err != nil {
		return nil, err
	}
	switch resp := f.Response().(type) {
	case []Result:
		if len(resp) != len(cmds) {
			return nil, fmt.Errorf("cluster: %d results for %d commands", len(resp), len(cmds))
		}
		return resp, nil
	case error:
		return nil, resp
	default:
		return nil, fmt.Errorf("cluster: unexpected apply response %T", resp)
	}
}

// AppliedNow returns, on the leader, the latest Now its ledger has
// applied (FSM.AppliedNow) once it has applied every entry committed
// before its current term: a command proposed at that instant or later is
// applied at its own Now, not raised by the clamp. A new leader may hold
// entries its predecessor committed that it has not applied yet, so the
// first call in each term waits for a raft barrier (one log entry, no
// command). On a follower it returns a *NotLeaderError, after Shutdown
// ErrClosed.
func (n *Node) AppliedNow(ctx context.Context) (bucket.Instant, error) {
	n.mu.Lock()
	closed := n.closed
	n.mu.Unlock()
	if closed {
		return 0, ErrClosed
	}
	if err := n.leading(); err != nil {
		return 0, err
	}
	// Read before the barrier: if the term moves on meanwhile, the next
	// call runs a barrier again (a spare one, never a missing one).
	term := n.raft.CurrentTerm()
	if n.barrierTerm.Load() != term {
		if err := n.wait(ctx, n.raft.Barrier(timeout(ctx))); err != nil {
			var nle *NotLeaderError
			switch {
			case errors.As(err, &nle):
				nle.Unknown = false // a barrier carries no command
			case errors.Is(err, raft.ErrRaftShutdown):
				err = ErrClosed
			}
			return 0, err
		}
		n.barrierTerm.Store(term)
	}
	return n.fsm.AppliedNow(), nil
}

// wait waits for f, until ctx ends or the node is shut down, and maps
// raft's errors to the package's.
//
// Raft never answers the future of an entry that was committed and queued
// for the FSM when it shut down (its FSM goroutine stops first; see
// https://github.com/hashicorp/raft/issues/498), so waiting on the future
// alone could wait forever: once Shutdown has stopped raft, an unanswered
// future is an unknown outcome. (That is also the answer if raft answered
// just before and the goroutine waiting on the future has not passed it
// on yet: unknown is always safe, the caller retries.) The goroutine
// waiting on such a future stays blocked.
func (n *Node) wait(ctx context.Context, f raft.Future) error {
	var err error
	done := make(chan error, 1)
	go func() { done <- f.Error() }()
	select {
	case err = <-done:
	case <-ctx.Done():
		return fmt.Errorf("%w: %w", ErrOutcomeUnknown, ctx.Err())
	case <-n.stopped:
		select {
		case err = <-done:
		default:
			return fmt.Errorf("%w: %w", ErrOutcomeUnknown, raft.ErrRaftShutdown)
		}
	}
	switch {
	case err == nil:
		return nil
	case errors.Is(err, raft.ErrNotLeader), errors.Is(err, raft.ErrLeadershipTransferInProgress):
		return n.notLeader(false)
	case errors.Is(err, raft.ErrLeadershipLost):
		return n.notLeader(true)
	case errors.Is(err, raft.ErrRaftShutdown), errors.Is(err, raft.ErrAbortedByRestore):
		return fmt.Errorf("%w: %w", ErrOutcomeUnknown, err)
	}
	return fmt.Errorf("cluster: %w", err)
}

// Shutdown stops the node (raft, then the store it opened). The other
// members see it as failed until it is removed or restarted. A call
// waiting in Apply, ApplyBatch, AddMember or RemoveMember returns with
// raft's answer if raft gave one before it stopped, and with an error
// wrapping ErrOutcomeUnknown otherwise.
func (n *Node) Shutdown() error {
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return nil
	}
	n.closed = true
	n.mu.Unlock()
	err := n.raft.Shutdown().Error()
	close(n.stopped)
	n.raft.DeregisterObserver(n.observer)
	// Raft's shutdown closes a NetworkTransport's listener but not its
	// pooled connections to the peers, whose goroutines serving them would
	// then wait on them for as long as the peers run.
	if cs, ok := n.trans.(interface{ CloseStreams() }); ok {
		cs.CloseStreams()
	}
	n.closeStore()
	return err
}

// watchedStore is the node's raft log and stable store, remembering
// whether the last write failed (Ready).
type watchedStore struct {
	raft.LogStore
	raft.StableStore
	last atomic.Pointer[error] // the last write's error; nil: it succeeded
}

func (w *watchedStore) wrote(err error) error {
	if err != nil {
		w.last.Store(&err)
	} else {
		w.last.Store(nil)
	}
	return err
}

// failing returns the last write's error, nil if it succeeded.
func (w *watchedStore) failing() error {
	if p := w.last.Load(); p != nil {
		return *p
	}
	return nil
}

func (w *watchedStore) StoreLog(l *raft.Log) error    { return w.wrote(w.LogStore.StoreLog(l)) }
func (w *watchedStore) StoreLogs(l []*raft.Log) error { return w.wrote(w.LogStore.StoreLogs(l)) }
func (w *watchedStore) DeleteRange(min, max uint64) error {
	return w.wrote(w.LogStore.DeleteRange(min, max))
}
func (w *watchedStore) Set(k, v []byte) error { return w.wrote(w.StableStore.Set(k, v)) }
func (w *watchedStore) SetUint64(k []byte, v uint64) error {
	return w.wrote(w.StableStore.SetUint64(k, v))
}
