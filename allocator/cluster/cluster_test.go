package cluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/rationhq/ration"
	"github.com/rationhq/ration/allocator/ledger"
	"github.com/rationhq/ration/bucket"
)

var ledgerCfg = ledger.Config{TTL: 10 * time.Second}

// fastRaft: timeouts short enough for tests to elect in tens of ms.
func fastRaft(c *raft.Config) {
	c.HeartbeatTimeout = 50 * time.Millisecond
	c.ElectionTimeout = 50 * time.Millisecond
	c.LeaderLeaseTimeout = 50 * time.Millisecond
	c.CommitTimeout = 5 * time.Millisecond
}

// syncBuffer collects a test's logs; they are printed if the test fails
// (raft's goroutines may log until Shutdown returns, after which t.Log
// would be too late).
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

type testCluster struct {
	t      testing.TB
	cfg    ledger.Config // every node's
	tune   []func(*raft.Config)
	logs   *syncBuffer
	logger *slog.Logger
	nodes  []*Node
	trans  []*raft.InmemTransport
	stores []*raft.InmemStore
	// Each node's snapshots, in a directory of its own: raft's file store,
	// as a deployment keeps them. (raft's in-memory store shows a snapshot
	// as the latest while it is being written, so a leader sending its
	// latest snapshot to a follower while it takes another reads it as it
	// is written: a data race, and a partial snapshot sent.)
	snaps []raft.SnapshotStore
	dir   string // the nodes' snapshot directories are in it
	down  []bool
}

// newCluster starts n connected nodes with ledgerCfg and bootstraps them
// as one cluster.
func newCluster(t testing.TB, n int, tune ...func(*raft.Config)) *testCluster {
	t.Helper()
	return newClusterWith(t, n, ledgerCfg, tune...)
}

// newClusterWith is newCluster with the ledger's configuration cfg.
func newClusterWith(t testing.TB, n int, cfg ledger.Config, tune ...func(*raft.Config)) *testCluster {
	t.Helper()
	c := &testCluster{t: t, cfg: cfg, tune: append([]func(*raft.Config){fastRaft}, tune...), logs: &syncBuffer{}}
	c.logger = slog.New(slog.NewTextHandler(c.logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	c.dir = t.TempDir() // before the cleanup below, which then runs first: nodes stop before their files go
	t.Cleanup(func() {
		for i, nd := range c.nodes {
			if !c.down[i] {
				if err := nd.Shutdown(); err != nil {
					t.Errorf("shutdown %s: %v", nd.ID(), err)
				}
			}
		}
		if t.Failed() {
			t.Logf("raft logs:\n%s", c.logs.String())
		}
	})
	var servers []raft.Server
	for range n {
		nd := c.add()
		servers = append(servers, raft.Server{ID: nd.ID(), Address: nd.Addr()})
	}
	if err := c.nodes[0].Bootstrap(servers...); err != nil {
		t.Fatal(err)
	}
	return c
}

// add starts one more node, connected to every other; it is not a member
// until bootstrapped or added.
func (c *testCluster) add() *Node {
	c.t.Helper()
	i := len(c.nodes)
	store := raft.NewInmemStore()
	snaps, err := raft.NewFileSnapshotStoreWithLogger(filepath.Join(c.dir, fmt.Sprintf("n%d", i)), 2, newHclog(c.logger))
	if err != nil {
		c.t.Fatal(err)
	}
	c.nodes, c.trans, c.stores, c.snaps, c.down = append(c.nodes, nil), append(c.trans, nil), append(c.stores, store), append(c.snaps, snaps), append(c.down, true)
	c.start(i)
	return c.nodes[i]
}

// start starts node i on its stores (its raft log and state, and its
// snapshots) with a new transport, connected to every other node.
func (c *testCluster) start(i int) {
	c.t.Helper()
	addr, tr := raft.NewInmemTransport(raft.ServerAddress(fmt.Sprintf("mem%d", i)))
	opts := []Option{WithStores(c.stores[i], c.stores[i]), WithSnapshotStore(c.snaps[i]), WithLogger(c.logger)}
	for _, f := range c.tune {
		opts = append(opts, WithRaftConfig(f))
	}
	nd, err := New(raft.ServerID(fmt.Sprintf("n%d", i)), tr, c.cfg, opts...)
	if err != nil {
		c.t.Fatal(err)
	}
	c.nodes[i], c.trans[i], c.down[i] = nd, tr, false
	for j, other := range c.trans {
		if j != i && other != nil {
			other.Connect(addr, tr)
			tr.Connect(other.LocalAddr(), other)
		}
	}
}

// restart starts node i, shut down, again from its stores, as a process
// restarted on the same disk would: it restores its latest snapshot and
// replays its log after it.
func (c *testCluster) restart(i int) {
	c.t.Helper()
	if !c.down[i] {
		c.t.Fatalf("restart %s: it is running", c.nodes[i].ID())
	}
	c.start(i)
}

func (c *testCluster) shutdown(i int) {
	c.t.Helper()
	if err := c.nodes[i].Shutdown(); err != nil {
		c.t.Fatal(err)
	}
	c.down[i] = true
	c.disconnect(i) // a dead process refuses connections: fail fast rather than time out
}

// disconnect cuts node i off from every other node, both ways.
func (c *testCluster) disconnect(i int) {
	c.trans[i].DisconnectAll()
	for j, tr := range c.trans {
		if j != i {
			tr.Disconnect(c.trans[i].LocalAddr())
		}
	}
}

func (c *testCluster) reconnect(i int) {
	for j, tr := range c.trans {
		if j != i {
			tr.Connect(c.trans[i].LocalAddr(), c.trans[i])
			c.trans[i].Connect(tr.LocalAddr(), tr)
		}
	}
}

const waitFor = 10 * time.Second

// Progress is the cluster's PeerProgress: a live node answers now, with
// its log's last index.
func (c *testCluster) Progress(addr raft.ServerAddress) (Contact, bool) {
	for i, nd := range c.nodes {
		if !c.down[i] && nd.Addr() == addr {
			return Contact{At: time.Now(), LastLog: nd.Raft().LastIndex()}, true
		}
	}
	return Contact{}, false
}

// leader polls until exactly one live node is the leader and the other
// live nodes agree on it.
func (c *testCluster) leader() *Node {
	c.t.Helper()
	deadline := time.Now().Add(waitFor)
	for time.Now().Before(deadline) {
		var leaders []*Node
		for i, nd := range c.nodes {
			if !c.down[i] && nd.IsLeader() {
				leaders = append(leaders, nd)
			}
		}
		if len(leaders) == 1 {
			return leaders[0]
		}
		time.Sleep(2 * time.Millisecond) // poll interval, not a wait for a condition
	}
	c.t.Fatalf("no single leader within %v", waitFor)
	return nil
}

// apply applies cmds as one entry at the leader, retrying at the new
// leader after a leadership change (safe: calls are exactly-once).
func (c *testCluster) apply(cmds ...ledger.Command) []Result {
	c.t.Helper()
	deadline := time.Now().Add(waitFor)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		res, err := c.leader().ApplyBatch(ctx, cmds)
		cancel()
		if err == nil {
			return res
		}
		if !errors.Is(err, ErrNotLeader) && !errors.Is(err, ErrOutcomeUnknown) || time.Now().After(deadline) {
			c.t.Fatalf("apply: %v", err)
		}
	}
}

// converge waits until every live node has applied the leader's last
// applied index, and checks that their states are byte-identical. It
// returns the state. Right after a leader change, call barrier first.
func (c *testCluster) converge() []byte {
	c.t.Helper()
	target := c.leader().FSM().AppliedIndex()
	deadline := time.Now().Add(waitFor)
	for {
		var first []byte
		var firstIdx uint64
		same, behind, seen := true, false, false
		for i, nd := range c.nodes {
			if c.down[i] {
				continue
			}
			st, idx := nd.FSM().StateSnapshot()
			if idx < target {
				behind = true
				break
			}
			if !seen { // (not first == nil: an empty state is nil)
				first, firstIdx, seen = st, idx, true
			} else if idx != firstIdx || !bytes.Equal(st, first) {
				same = false
			}
		}
		if !behind && same {
			return first
		}
		if time.Now().After(deadline) {
			for i, nd := range c.nodes {
				if !c.down[i] {
					st, idx := nd.FSM().StateSnapshot()
					c.t.Logf("%s: index %d, state %d bytes %x", nd.ID(), idx, len(st), st)
				}
			}
			c.t.Fatalf("nodes did not converge on index >= %d within %v (behind %v)", target, waitFor, behind)
		}
		time.Sleep(2 * time.Millisecond) // poll interval
	}
}

// barrier waits until the leader has applied every command committed
// before it. A new leader applies the entries its predecessor committed
// only once it has committed one of its own term: until then its FSM, and
// every follower's, may lack the last commands, and converge would compare
// states that are all behind. A barrier is such an entry (one the FSM does
// not see: it counts as apply lag until the next command), and is answered
// once the leader's FSM has applied everything before it.
func (c *testCluster) barrier() {
	c.t.Helper()
	deadline := time.Now().Add(waitFor)
	for {
		err := c.leader().Raft().Barrier(waitFor).Error()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("barrier on the leader: %v", err)
		}
	}
}

// workload produces valid ledger commands from a few spenders on a few
// keys, with time advancing, and applies each to a reference State too:
// the cluster must give the same replies and state as one State applying
// the same commands in the same order.
type workload struct {
	t    *testing.T
	now  bucket.Instant
	seq  map[string]uint64
	i    int
	ref  *ledger.State
	want [][]any // the reference replies, per entry
}

func newWorkload(t *testing.T) *workload {
	ref, err := ledger.New(ledgerCfg)
	if err != nil {
		t.Fatal(err)
	}
	return &workload{t: t, now: ledger.InstantOf(time.Date(2026, 12, 1, 20, 0, 0, 0, time.UTC)), seq: map[string]uint64{}, ref: ref}
}

var testLimits = ration.Limits{RPM: 600, TPM: 100_000}

func (w *workload) next() ledger.Command {
	w.i++
	w.now += bucket.Instant(50 * time.Millisecond / time.Microsecond)
	spender := fmt.Sprintf("gw%d", w.i%3)
	key := fmt.Sprintf("key%d", w.i%4)
	if w.i%17 == 0 {
		return ledger.Sweep{Now: w.now}
	}
	w.seq[spender]++
	caller := ledger.Caller{SpenderID: spender, Epoch: 1, Sequence: w.seq[spender]}
	if w.i%5 == 0 {
		return ledger.ReserveAhead{Now: w.now, Caller: caller, Keys: []ledger.ReserveKey{{Key: key, Limits: testLimits, Cost: ration.Amount{Requests: 1, Tokens: 200}, MaxWait: time.Second}}}
	}
	return ledger.Acquire{Now: w.now, Caller: caller, Keys: []ledger.AcquireKey{{Key: key, Limits: testLimits,
		Want: ration.Amount{Requests: 5, Tokens: 1000}, Need: ration.Amount{Requests: 1, Tokens: 1},
		SpendRate: ration.Amount{Requests: int64(w.i % 7), Tokens: int64(100 * (w.i % 5))}}}}
}

// run applies n commands in entries of up to group commands and checks
// the replies against the reference.
func (w *workload) run(c *testCluster, n, group int) {
	w.t.Helper()
	for n > 0 {
		g := min(group, n)
		n -= g
		cmds := make([]ledger.Command, g)
		for i := range cmds {
			cmds[i] = w.next()
		}
		res := c.apply(cmds...)
		for i, cmd := range cmds {
			want, _, wantErr := w.ref.Apply(cmd)
			if res[i].Err != nil || wantErr != nil {
				w.t.Fatalf("command %+v: err %v, reference err %v", cmd, res[i].Err, wantErr)
			}
			if !reflect.DeepEqual(res[i].Reply, want) {
				w.t.Fatalf("command %+v: reply\n%+v\nreference\n%+v", cmd, res[i].Reply, want)
			}
		}
	}
}

func (w *workload) check(state []byte) {
	w.t.Helper()
	if !bytes.Equal(state, w.ref.Snapshot()) {
		w.t.Fatalf("replicated state (%d bytes) differs from the reference (%d bytes)", len(state), len(w.ref.Snapshot()))
	}
}

// (a) Three nodes elect a leader and apply commands, singly and in
// groups; the replies are the reference State's; every node ends with the
// same state, byte for byte; a follower refuses with the leader's address.
func TestClusterReplicates(t *testing.T) {
	c := newCluster(t, 3)
	w := newWorkload(t)
	w.run(c, 30, 1)
	w.run(c, 60, 6)
	w.check(c.converge())

	ld := c.leader()
	for _, nd := range c.nodes {
		if nd == ld {
			continue
		}
		_, err := nd.Apply(context.Background(), ledger.Sweep{Now: w.now})
		var nl *NotLeaderError
		if !errors.As(err, &nl) || !errors.Is(err, ErrNotLeader) || errors.Is(err, ErrOutcomeUnknown) {
			t.Fatalf("follower %s: err = %v, want a NotLeaderError", nd.ID(), err)
		}
		// The follower may not have heard from this leader yet: poll.
		deadline := time.Now().Add(waitFor)
		for nl.Leader != ld.Addr() && time.Now().Before(deadline) {
			time.Sleep(2 * time.Millisecond)
			_, err = nd.Apply(context.Background(), ledger.Sweep{Now: w.now})
			errors.As(err, &nl)
		}
		if nl.Leader != ld.Addr() || nl.LeaderID != ld.ID() {
			t.Fatalf("follower %s names leader %q (%q), want %q (%q)", nd.ID(), nl.Leader, nl.LeaderID, ld.Addr(), ld.ID())
		}
	}
}

// (b) The leader shuts down; the other two elect a new one, which serves
// the next commands with the reference's replies; their states are
// identical.
func TestClusterFailover(t *testing.T) {
	c := newCluster(t, 3)
	w := newWorkload(t)
	w.run(c, 20, 4)
	old := c.leader()
	c.converge()
	for i, nd := range c.nodes {
		if nd == old {
			c.shutdown(i)
		}
	}
	if _, err := old.Apply(context.Background(), ledger.Sweep{Now: w.now}); !errors.Is(err, ErrClosed) {
		t.Fatalf("apply on a shut down node: %v, want ErrClosed", err)
	}
	if nl := c.leader(); nl == old {
		t.Fatal("the old leader is still the leader")
	}
	w.run(c, 20, 1)
	w.run(c, 20, 5)
	w.check(c.converge())
}

// (c) A node cut off while the others compact their logs catches up from
// a snapshot when it is back, and so does a node added afterwards.
func TestClusterSnapshotCatchUp(t *testing.T) {
	c := newCluster(t, 3, func(rc *raft.Config) {
		rc.SnapshotThreshold = 8
		rc.SnapshotInterval = 20 * time.Millisecond
		rc.TrailingLogs = 2
	})
	w := newWorkload(t)
	w.run(c, 10, 1)
	c.converge()
	ld := c.leader()
	cut := 0
	for c.nodes[cut] == ld {
		cut++
	}
	c.disconnect(cut)
	cutIndex := c.nodes[cut].Raft().LastIndex() // what its log holds, applied or not
	w.run(c, 40, 2)
	// Wait until the leader's log no longer holds what the cut node
	// lacks: it can only catch up from a snapshot.
	deadline := time.Now().Add(waitFor)
	for {
		ld = c.leader()
		var store *raft.InmemStore
		for i, nd := range c.nodes {
			if nd == ld {
				store = c.stores[i]
			}
		}
		first, err := store.FirstIndex()
		if err != nil {
			t.Fatal(err)
		}
		if first > cutIndex+1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the leader's log still starts at %d (cut node at %d)", first, cutIndex)
		}
		time.Sleep(2 * time.Millisecond) // poll interval
	}
	c.reconnect(cut)
	w.run(c, 3, 1)
	w.check(c.converge())
	if c.nodes[cut].FSM().Restores() == 0 {
		t.Fatal("the reconnected node caught up without a snapshot")
	}

	fresh := c.add()
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	for {
		err := c.leader().AddMember(ctx, fresh.ID(), fresh.Addr(), c)
		if err == nil {
			break
		}
		if !errors.Is(err, ErrNotLeader) {
			t.Fatal(err)
		}
	}
	w.run(c, 3, 1)
	w.check(c.converge())
	if fresh.FSM().Restores() == 0 {
		t.Fatal("the added node caught up without a snapshot")
	}
}

// (d) Exactly-once across a leader change: a call applied through the old
// leader and repeated (same spender, epoch, sequence and body, later Now)
// through the new one gets the stored reply and changes nothing; the same
// sequence with another body is refused; the next sequence is applied.
func TestClusterExactlyOnceAcrossLeaderChange(t *testing.T) {
	c := newCluster(t, 3)
	w := newWorkload(t)
	w.run(c, 12, 3)
	now := w.now + 1000
	caller := ledger.Caller{SpenderID: "once", Epoch: 3, Sequence: 1}
	call := ledger.Acquire{Now: now, Caller: caller, Keys: []ledger.AcquireKey{{Key: "key1", Limits: testLimits, Want: ration.Amount{Requests: 7, Tokens: 700}}}}
	first := c.apply(call)[0]
	if first.Err != nil || first.Changed.Empty() {
		t.Fatalf("first call: %+v", first)
	}
	c.converge()
	old := c.leader()
	for i, nd := range c.nodes {
		if nd == old {
			c.shutdown(i)
		}
	}
	before := c.converge()

	retry := call
	retry.Now = now + 5_000_000 // five seconds later, after the failover
	again := c.apply(retry)[0]
	if again.Err != nil {
		t.Fatalf("retry: %v", again.Err)
	}
	if !reflect.DeepEqual(again.Reply, first.Reply) {
		t.Fatalf("retry reply\n%+v\nfirst reply\n%+v", again.Reply, first.Reply)
	}
	if !again.Changed.Empty() {
		t.Fatalf("retry changed %+v", again.Changed)
	}
	if after := c.converge(); !bytes.Equal(after, before) {
		t.Fatal("the retry changed the state")
	}

	other := retry
	other.Keys = []ledger.AcquireKey{{Key: "key1", Limits: testLimits, Want: ration.Amount{Requests: 8, Tokens: 700}}}
	if r := c.apply(other)[0]; !errors.Is(r.Err, ledger.ErrSequenceReused) {
		t.Fatalf("same sequence, other body: %v, want ErrSequenceReused", r.Err)
	}
	next := retry
	next.Caller.Sequence = 2
	if r := c.apply(next)[0]; r.Err != nil || r.Changed.Empty() {
		t.Fatalf("next sequence: %+v", r)
	}
	c.converge()
}

// Several callers at once: concurrent Applies on the leader each get
// their own reply, and the replicas agree.
func TestClusterConcurrentApply(t *testing.T) {
	c := newCluster(t, 3)
	ld := c.leader()
	now := ledger.InstantOf(time.Date(2026, 12, 1, 21, 0, 0, 0, time.UTC))
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for g := range 8 {
		wg.Go(func() {
			for s := uint64(1); s <= 10; s++ {
				cmd := ledger.Acquire{Now: now + bucket.Instant(s), Caller: ledger.Caller{SpenderID: fmt.Sprintf("c%d", g), Epoch: 1, Sequence: s},
					Keys: []ledger.AcquireKey{{Key: "shared", Limits: testLimits, Want: ration.Amount{Requests: 1, Tokens: 10}}}}
				r, err := ld.Apply(context.Background(), cmd)
				if err == nil {
					if ar, ok := r.(*ledger.AcquireReply); !ok || len(ar.Keys) != 1 {
						err = fmt.Errorf("reply %+v", r)
					}
				}
				if err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		// A leadership change under load is possible on a slow machine;
		// anything else is a failure.
		if !errors.Is(err, ErrNotLeader) {
			t.Fatal(err)
		}
	}
	c.converge()
}
