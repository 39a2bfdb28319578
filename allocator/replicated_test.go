package allocator

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect/v2"
	"connectrpc.com/connect/v2/connectproto"
	"github.com/hashicorp/raft"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/protobuf/proto"

	"github.com/rationhq/ration"
	"github.com/rationhq/ration/allocator/cluster"
	"github.com/rationhq/ration/allocator/ledger"
	"github.com/rationhq/ration/internal/testkit"
	leasev1 "github.com/rationhq/ration/proto/ration/lease/v1"
)

// testRaft: raft timeouts for tests. The leader lease (how long a leader
// cut off from a majority keeps leading) is 200 ms, long enough that a
// call proposed right after the cut is in flight when leadership is lost.
func testRaft(c *raft.Config) {
	c.HeartbeatTimeout = 200 * time.Millisecond
	c.ElectionTimeout = 200 * time.Millisecond
	c.LeaderLeaseTimeout = 200 * time.Millisecond
	c.CommitTimeout = 5 * time.Millisecond
}

// members is a cluster of replicated Ledgers on raft's in-memory
// transport, all on one fake clock, each with its Service.
type members struct {
	t      *testing.T
	clk    *fakeClock
	urls   map[raft.ServerID]string
	led    []*Member
	svc    []*Service
	trans  []*raft.InmemTransport
	down   []bool
	logs   *testkit.SyncBuffer
	closed sync.Once
}

func newMembers(t *testing.T, n int) *members {
	t.Helper()
	return newMembersWith(t, n, nil)
}

// newMembersWith is newMembers with more options for member i, opts(i),
// after the shared clock (so a WithClock there gives it a clock of its
// own); opts may be nil.
func newMembersWith(t *testing.T, n int, opts func(i int) []Option) *members {
	t.Helper()
	m := &members{t: t, clk: newFakeClock(), urls: map[raft.ServerID]string{}, logs: &testkit.SyncBuffer{}}
	logger := slog.New(slog.NewTextHandler(m.logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	var servers []raft.Server
	for i := range n {
		id := raft.ServerID(fmt.Sprintf("m%d", i))
		addr, tr := raft.NewInmemTransport(raft.ServerAddress(fmt.Sprintf("mem%d", i)))
		m.urls[id] = fmt.Sprintf("http://member-%d.test:7450", i)
		for _, other := range m.trans {
			other.Connect(addr, tr)
			tr.Connect(other.LocalAddr(), other)
		}
		m.trans = append(m.trans, tr)
		servers = append(servers, raft.Server{ID: id, Address: addr})
	}
	for i, s := range servers {
		lopts := []Option{WithClock(m.clk), WithLogger(logger)}
		if opts != nil {
			lopts = append(lopts, opts(i)...)
		}
		l, err := NewReplicated(ClusterConfig{ID: s.ID, Transport: m.trans[i],
			Node: []cluster.Option{cluster.WithRaftConfig(testRaft), cluster.WithAPIURLs(m.urls)}}, lopts...)
		if err != nil {
			t.Fatal(err)
		}
		m.led, m.svc, m.down = append(m.led, l), append(m.svc, NewService(l.Ledger)), append(m.down, false)
	}
	t.Cleanup(func() {
		for i, l := range m.led {
			if !m.down[i] {
				if err := l.Close(); err != nil {
					t.Errorf("close member %d: %v", i, err)
				}
			}
		}
		if t.Failed() {
			t.Logf("logs:\n%s", m.logs.String())
		}
	})
	if err := m.led[0].Node().Bootstrap(servers...); err != nil {
		t.Fatal(err)
	}
	return m
}

// leader polls until one live member leads and every other live member
// that is connected knows it, and returns its index.
func (m *members) leader() int {
	m.t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		lead := -1
		for i, l := range m.led {
			if !m.down[i] && l.Node().IsLeader() {
				lead = i
			}
		}
		if lead < 0 {
			continue
		}
		all := true
		for i, l := range m.led {
			if !m.down[i] && l.Node().Ready() != nil {
				all = false
			}
		}
		if all {
			return lead
		}
	}
	m.t.Fatal("no leader known to every live member within 10 s")
	return -1
}

// kill stops member i as a dead process: shut down and cut off.
func (m *members) kill(i int) {
	m.t.Helper()
	if err := m.led[i].Close(); err != nil {
		m.t.Fatal(err)
	}
	m.down[i] = true
	m.disconnect(i)
}

// disconnect cuts member i off from the others, both ways.
func (m *members) disconnect(i int) {
	m.trans[i].DisconnectAll()
	for j, tr := range m.trans {
		if j != i {
			tr.Disconnect(m.trans[i].LocalAddr())
		}
	}
}

func (m *members) reconnect(i int) {
	for j, tr := range m.trans {
		if j != i {
			tr.Connect(m.trans[i].LocalAddr(), m.trans[i])
			m.trans[i].Connect(tr.LocalAddr(), tr)
		}
	}
}

// converge polls until every live member's state is want, byte for byte.
func (m *members) converge(want []byte) {
	m.t.Helper()
	var got []byte
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		same := true
		for i, l := range m.led {
			if !m.down[i] {
				if got, _ = l.Node().FSM().StateSnapshot(); !bytes.Equal(got, want) {
					same = false
				}
			}
		}
		if same {
			return
		}
	}
	m.t.Fatalf("members did not converge to the reference state (%d bytes; one has %d)", len(want), len(got))
}

// notLeader returns err's NOT_LEADER ErrorInfo, failing the test unless
// err is CodeUnavailable carrying one.
func notLeaderInfo(t *testing.T, err error) *errdetails.ErrorInfo {
	t.Helper()
	var ce *connect.Error
	if !errors.As(err, &ce) || ce.Code() != connect.CodeUnavailable {
		t.Fatalf("error %v, want CodeUnavailable", err)
	}
	for _, d := range ce.Details() {
		m, err := connectproto.UnmarshalErrorDetail(d)
		if err != nil {
			t.Fatal(err)
		}
		if info, ok := m.(*errdetails.ErrorInfo); ok && info.GetDomain() == ration.ErrorDomain && info.GetReason() == ration.ReasonNotLeader {
			return info
		}
	}
	t.Fatalf("error %v carries no NOT_LEADER ErrorInfo", err)
	return nil
}

func clusterAcquire(spender string, seq uint64, want int64) *leasev1.AcquireRequest {
	return &leasev1.AcquireRequest{Caller: &leasev1.Caller{SpenderId: spender, Epoch: 1, Sequence: seq},
		Keys: []*leasev1.KeyAcquire{{Key: "k", Limits: &leasev1.Limits{Rpm: 600, Tpm: 6000}, Want: &leasev1.Amount{Requests: 1, Tokens: want}}}}
}

// reference is a one-process Ledger on the members' clock: what the
// cluster's state must equal once it applied the same calls, each once.
func (m *members) reference() (*Ledger, *Service) {
	l := newLedger(m.t, m.clk)
	return l, NewService(l)
}

// TestReplicatedFollowerAnswersNotLeader: through the connect Service, a
// follower refuses every method with CodeUnavailable and a NOT_LEADER
// ErrorInfo naming the leader's API URL, and applies nothing; the leader
// grants, and the followers apply what it did. A member cut off, knowing
// no leader, answers NOT_LEADER without a URL.
func TestReplicatedFollowerAnswersNotLeader(t *testing.T) {
	m := newMembers(t, 3)
	lead := m.leader()
	follower := (lead + 1) % 3
	for _, call := range []struct {
		name string
		do   func(*Service) error
	}{
		{"Acquire", func(s *Service) error { _, err := s.Acquire(ctx, clusterAcquire("gw", 1, 100)); return err }},
		{"ReserveAhead", func(s *Service) error {
			_, err := s.ReserveAhead(ctx, &leasev1.ReserveAheadRequest{Caller: &leasev1.Caller{SpenderId: "gw", Epoch: 1, Sequence: 1},
				Keys: []*leasev1.KeyReserve{{Key: "k", Limits: &leasev1.Limits{Tpm: 6000}, Cost: &leasev1.Amount{Tokens: 10}}}})
			return err
		}},
		{"Release", func(s *Service) error {
			_, err := s.Release(ctx, &leasev1.ReleaseRequest{Caller: &leasev1.Caller{SpenderId: "gw", Epoch: 1, Sequence: 1}})
			return err
		}},
	} {
		info := notLeaderInfo(t, call.do(m.svc[follower]))
		if got, want := info.GetMetadata()[ration.MetaLeader], m.urls[m.led[lead].Node().ID()]; got != want {
			t.Errorf("%s on a follower: leader %q, want %q", call.name, got, want)
		}
	}
	if st := m.led[lead].Stats(); st.Keys != 0 || st.Sessions != 0 {
		t.Fatalf("the follower's refusals changed the state: %+v", st)
	}
	r, err := m.svc[lead].Acquire(ctx, clusterAcquire("gw", 1, 100))
	if err != nil || r.GetKeys()[0].GetGranted().GetTokens() != 100 {
		t.Fatalf("on the leader: %v %v", r, err)
	}
	ref, refSvc := m.reference()
	if _, err := refSvc.Acquire(ctx, clusterAcquire("gw", 1, 100)); err != nil {
		t.Fatal(err)
	}
	m.converge(memoryOf(ref).state.Snapshot())
	if st := m.led[follower].Stats(); st.Keys != 1 || st.Holdings != 1 {
		t.Fatalf("follower stats %+v, want the leader's key and holding", st)
	}

	// Cut off, the follower loses its leader and names none.
	m.disconnect(follower)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if addr, _ := m.led[follower].Node().Leader(); addr == "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the cut-off follower still knows a leader after 10 s")
		}
	}
	info := notLeaderInfo(t, func() error { _, err := m.svc[follower].Acquire(ctx, clusterAcquire("gw2", 1, 100)); return err }())
	if _, ok := info.GetMetadata()[ration.MetaLeader]; ok {
		t.Fatalf("a member that knows no leader named one: %v", info)
	}
	// Bad input is refused as such on any member, before it reaches the log.
	if _, err := m.svc[follower].Acquire(ctx, &leasev1.AcquireRequest{}); connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Fatalf("bad input on a follower: %v", err)
	}
}

// TestReplicatedRetryAfterFailoverAppliedOnce: a call retried at the new
// leader after a failover is applied once, whether the first attempt was
// committed (its reply lost with the old leader) or left in flight on a
// leader that lost its leadership (the outcome unknown to the caller).
// Every member ends with the state of a single ledger that applied each
// call once.
func TestReplicatedRetryAfterFailoverAppliedOnce(t *testing.T) {
	m := newMembers(t, 3)
	ref, refSvc := m.reference()
	lead := m.leader()

	// Committed, then the leader dies before the caller reads the reply.
	first := clusterAcquire("gw-a", 1, 1000)
	r1, err := m.svc[lead].Acquire(ctx, first)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := refSvc.Acquire(ctx, first); err != nil {
		t.Fatal(err)
	}
	m.kill(lead)
	lead2 := m.leader()
	again, err := m.svc[lead2].Acquire(ctx, first)
	if err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(again, r1) {
		t.Fatalf("retry at the new leader:\n got %v\nwant the stored reply %v", again, r1)
	}
	if rem := again.GetKeys()[0].GetSnapshot().GetTokens().GetRemaining(); rem != 5000 {
		t.Fatalf("after the retry %d tokens remain, want 5000 (granted once)", rem)
	}

	// In flight on a leader cut off from the majority: it loses its
	// leadership with the entry uncommitted, and answers that the outcome
	// is unknown (NOT_LEADER, Unknown). The retry at the new leader is
	// applied, once.
	old := lead2
	m.disconnect(old)
	second := clusterAcquire("gw-b", 1, 2000)
	_, err = m.svc[old].Acquire(ctx, second)
	notLeaderInfo(t, err)
	var nle *cluster.NotLeaderError
	if !errors.As(err, &nle) || !nle.Unknown || !errors.Is(err, cluster.ErrOutcomeUnknown) {
		t.Fatalf("in flight at the cut: %v, want a NotLeaderError with the outcome unknown", err)
	}
	live := 3 - old - lead // the third member, the only one besides old still running
	// The one live member left in the majority's side cannot elect alone:
	// the old leader rejoins as a follower first.
	m.reconnect(old)
	lead3 := m.leader()
	r2, err := m.svc[lead3].Acquire(ctx, second)
	if err != nil || r2.GetKeys()[0].GetGranted().GetTokens() != 2000 {
		t.Fatalf("retry after leadership was lost: %v %v", r2, err)
	}
	if again, err := m.svc[lead3].Acquire(ctx, second); err != nil || !proto.Equal(again, r2) {
		t.Fatalf("second retry: %v %v, want the stored reply", again, err)
	}
	if _, err := refSvc.Acquire(ctx, second); err != nil {
		t.Fatal(err)
	}
	m.converge(memoryOf(ref).state.Snapshot())
	t.Logf("leaders: m%d, m%d (cut off), then m%d; m%d alive throughout", lead, old, lead3, live)
}

// TestReplicatedGroupsCallsIntoOneEntry: calls that arrive while an entry
// is in flight go into the next entry together (up to maxEntryCalls, and maxEntryKeys keys), each
// answered with its own result; a call with bad input is refused before
// the queue and does not spoil the entry.
func TestReplicatedGroupsCallsIntoOneEntry(t *testing.T) {
	for _, tc := range []struct {
		calls, keys, entries int // calls of keys each, in entries
	}{{1, 1, 1}, {40, 1, 1}, {maxEntryCalls, 1, 1}, {maxEntryCalls + 3, 1, 2},
		{maxEntryKeys / ration.MaxBatch, ration.MaxBatch, 1}, {maxEntryKeys/ration.MaxBatch + 1, ration.MaxBatch, 2}} {
		t.Run(fmt.Sprintf("%d calls of %d keys", tc.calls, tc.keys), func(t *testing.T) {
			m := newMembers(t, 1)
			l := m.led[m.leader()]
			r := l.rep
			// A first call commits after the new leader's own entry.
			if _, err := l.Acquire(ctx, caller("warm-up", 1, 1), []ledger.AcquireKey{{Key: "k", Limits: tpm(60)}}); err != nil {
				t.Fatal(err)
			}
			// Hold the group commit as if an entry were in flight.
			held := hold(r.gc)
			before := l.Node().Raft().LastIndex()
			var wg sync.WaitGroup
			errs := make([]error, tc.calls)
			replies := make([]*ledger.AcquireReply, tc.calls)
			for i := range tc.calls {
				wg.Go(func() {
					keys := []ledger.AcquireKey{{Key: fmt.Sprintf("k%d", i%7), Limits: tpm(1 << 30), Want: ration.Amount{Tokens: int64(i + 1)}}}
					for k := 1; k < tc.keys; k++ {
						keys = append(keys, ledger.AcquireKey{Key: fmt.Sprintf("other-%d", k), Limits: tpm(1 << 30)})
					}
					replies[i], errs[i] = l.Acquire(ctx, caller(fmt.Sprintf("gw-%d", i), 1, 1), keys)
				})
			}
			for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
				r.mu.Lock()
				n := r.appended
				r.mu.Unlock()
				if n == uint64(tc.calls)+1 { // and the warm-up
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("%d of %d calls queued", n-1, tc.calls)
				}
			}
			_, err := l.Acquire(ctx, caller("", 1, 1), []ledger.AcquireKey{{Key: "k", Limits: tpm(60)}})
			wantErr(t, err, ledger.ErrInvalidArgument)
			held()
			wg.Wait()
			for i := range tc.calls {
				if errs[i] != nil || replies[i].Keys[0].Granted.Tokens != int64(i+1) {
					t.Fatalf("call %d: %v %+v", i, errs[i], replies[i])
				}
			}
			if got := l.Node().Raft().LastIndex() - before; got != uint64(tc.entries) {
				t.Fatalf("%d calls in %d log entries, want %d", tc.calls, got, tc.entries)
			}
		})
	}
}

// TestReplicatedCloseAndSweep: the leader sweeps through the log; a
// follower's sweep is refused as not the leader; Stats read the replica's
// state; calls after Close are ErrClosed.
func TestReplicatedCloseAndSweep(t *testing.T) {
	m := newMembers(t, 3)
	lead := m.leader()
	follower := (lead + 1) % 3
	if _, err := m.led[lead].Acquire(ctx, caller("gw", 1, 1), []ledger.AcquireKey{{Key: "k", Limits: tpm(600), Want: ration.Amount{Tokens: 10}}}); err != nil {
		t.Fatal(err)
	}
	_, _, err := m.led[follower].Sweep(ctx)
	var nle *cluster.NotLeaderError
	if !errors.As(err, &nle) || nle.Unknown || nle.URL != m.urls[m.led[lead].Node().ID()] {
		t.Fatalf("sweep on a follower: %v", err)
	}
	m.clk.Advance(2 * time.Hour) // past the TTL, the refill and the session retention
	keys, sessions, err := m.led[lead].Sweep(ctx)
	if err != nil || keys != 1 || sessions != 1 {
		t.Fatalf("sweep on the leader: %d keys, %d sessions, %v", keys, sessions, err)
	}
	ref, _ := m.reference()
	m.converge(memoryOf(ref).state.Snapshot()) // empty again everywhere
	m.kill(follower)
	if _, err := m.led[follower].Acquire(ctx, caller("gw", 1, 2), []ledger.AcquireKey{{Key: "k", Limits: tpm(600)}}); !errors.Is(err, ErrClosed) {
		t.Fatalf("after Close: %v", err)
	}
}

// TestEntryFitsMaxEntryBytes: the largest entry a replicated Ledger
// proposes (maxEntryKeys keys of the longest ids and the largest values,
// in few calls or in maxEntryCalls calls of the longest spender ids)
// encodes within cluster.MaxEntryBytes, which a StreamLayer refuses to
// exceed.
func TestEntryFitsMaxEntryBytes(t *testing.T) {
	m := ration.Amount{Requests: ration.MaxAmount, Tokens: ration.MaxAmount}
	call := func(i, keys int) ledger.Command {
		a := ledger.Acquire{Now: 1 << 60, Caller: ledger.Caller{SpenderID: fmt.Sprintf("%0*d", ration.MaxSpenderIDLen, i),
			Epoch: 1 << 63, Sequence: 1 << 63}}
		for k := range keys {
			a.Keys = append(a.Keys, ledger.AcquireKey{Key: fmt.Sprintf("%0*d", ration.MaxKeyLen, k),
				Limits: ration.Limits{RPM: ration.MaxRate, TPM: ration.MaxRate},
				Want:   m, Need: m, SpendRate: m, Returned: m, Held: m, Debt: m, Demand: m})
		}
		return a
	}
	for _, shape := range []struct{ calls, keys int }{
		{maxEntryKeys / ration.MaxBatch, ration.MaxBatch},
		{maxEntryCalls, maxEntryKeys / maxEntryCalls},
	} {
		size := 1 + binary.MaxVarintLen64 // version, command count
		for i := range shape.calls {
			b, err := ledger.EncodeCommand(call(i, shape.keys))
			if err != nil {
				t.Fatal(err)
			}
			size += binary.MaxVarintLen64 + len(b)
		}
		t.Logf("%d calls of %d keys: %d bytes at most", shape.calls, shape.keys, size)
		if size > cluster.MaxEntryBytes {
			t.Errorf("%d calls of %d keys encode in up to %d bytes, over cluster.MaxEntryBytes (%d)", shape.calls, shape.keys, size, cluster.MaxEntryBytes)
		}
	}
}
