package cluster

import (
	"bytes"
	"reflect"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/rationhq/ration"
	"github.com/rationhq/ration/allocator/ledger"
	"github.com/rationhq/ration/bucket"
)

func seconds(s int) bucket.Instant {
	return bucket.Instant(time.Duration(s) * time.Second / time.Microsecond)
}

var slowLimits = ration.Limits{RPM: 60} // one request a second

// clockCase is a history in which the proposer's clock goes back: a
// command at ahead drains key "clock", then commands proposed at earlier
// instants reserve on it (a wait), take a fresh holding (an expiry) and
// sweep; then one at a later instant than ahead. proposed is what was
// proposed; applied is the same commands with Now raised to the latest
// Now before them (written out here, not computed with clampNow).
func clockCase(base bucket.Instant) (proposed, applied []ledger.Command) {
	ahead, behind := base+seconds(10), base+seconds(2)
	proposed = []ledger.Command{
		ledger.Acquire{Now: ahead, Caller: ledger.Caller{SpenderID: "fast", Epoch: 1, Sequence: 1},
			Keys: []ledger.AcquireKey{{Key: "clock", Limits: slowLimits, Want: ration.Amount{Requests: 60}}}},
		ledger.ReserveAhead{Now: behind, Caller: ledger.Caller{SpenderID: "slow", Epoch: 1, Sequence: 1},
			Keys: []ledger.ReserveKey{{Key: "clock", Limits: slowLimits, Cost: ration.Amount{Requests: 5}, MaxWait: time.Minute}}},
		ledger.Acquire{Now: behind + 1, Caller: ledger.Caller{SpenderID: "late", Epoch: 1, Sequence: 1},
			Keys: []ledger.AcquireKey{{Key: "fresh", Limits: testLimits, Want: ration.Amount{Requests: 5, Tokens: 1000}}}},
		ledger.Sweep{Now: behind + 2},
		ledger.ReserveAhead{Now: ahead + seconds(3), Caller: ledger.Caller{SpenderID: "slow", Epoch: 1, Sequence: 2},
			Keys: []ledger.ReserveKey{{Key: "clock", Limits: slowLimits, Cost: ration.Amount{Requests: 1}, MaxWait: time.Minute}}},
	}
	applied = []ledger.Command{proposed[0], nil, nil, ledger.Sweep{Now: ahead}, proposed[4]}
	r := proposed[1].(ledger.ReserveAhead)
	r.Now = ahead
	applied[1] = r
	a := proposed[2].(ledger.Acquire)
	a.Now = ahead
	applied[2] = a
	return proposed, applied
}

// applyAll applies cmds to a fresh State and returns the replies and the
// final state.
func applyAll(t *testing.T, cmds []ledger.Command) ([]any, []byte) {
	t.Helper()
	st, err := ledger.New(ledgerCfg)
	if err != nil {
		t.Fatal(err)
	}
	var replies []any
	for _, c := range cmds {
		r, _, err := st.Apply(c)
		if err != nil {
			t.Fatalf("reference %+v: %v", c, err)
		}
		replies = append(replies, r)
	}
	return replies, st.Snapshot()
}

// The FSM applies a command whose Now is before the latest applied one at
// that latest Now: its replies and state are a plain State's given the
// raised commands, within one entry and across entries, and a snapshot
// carries the raised instant.
func TestFSMClampsNow(t *testing.T) {
	base := ledger.InstantOf(time.Date(2026, 12, 1, 21, 0, 0, 0, time.UTC))
	proposed, applied := clockCase(base)
	wantReplies, wantState := applyAll(t, applied)
	// The history discriminates: applied as proposed, the state differs.
	if _, raw := applyAll(t, proposed); bytes.Equal(raw, wantState) {
		t.Fatal("test history: the proposed and the raised commands give the same state")
	}
	for _, split := range []int{1, 2, len(proposed)} { // entries of split commands
		f, err := NewFSM(ledgerCfg)
		if err != nil {
			t.Fatal(err)
		}
		var got []any
		for i, idx := 0, uint64(1); i < len(proposed); i, idx = i+split, idx+1 {
			b, err := encodeEntry(proposed[i:min(i+split, len(proposed))])
			if err != nil {
				t.Fatal(err)
			}
			res, ok := f.Apply(&raft.Log{Index: idx, Type: raft.LogCommand, Data: b}).([]Result)
			if !ok {
				t.Fatalf("split %d: entry %d refused", split, idx)
			}
			for _, r := range res {
				if r.Err != nil {
					t.Fatalf("split %d: %v", split, r.Err)
				}
				got = append(got, r.Reply)
			}
		}
		if !reflect.DeepEqual(got, wantReplies) {
			t.Fatalf("split %d: replies\n%+v\nwant\n%+v", split, got, wantReplies)
		}
		if st, _ := f.StateSnapshot(); !bytes.Equal(st, wantState) {
			t.Fatalf("split %d: state differs from the reference's", split)
		}
		if f.now != base+seconds(13) {
			t.Fatalf("split %d: now %d, want %d", split, f.now, base+seconds(13))
		}
	}
}

// Time never goes back across a leader change: a command applied through
// one leader at a later instant, then commands proposed through the next
// leader with a clock behind it, get the replies (waits, holdings'
// expiries in the state) of a plain State applying them at the later
// instant, and every replica holds that state.
func TestClusterClockBehindAfterFailover(t *testing.T) {
	c := newCluster(t, 3)
	w := newWorkload(t)
	w.run(c, 9, 3)
	base := w.now + 1 // after the workload's commands
	proposed, applied := clockCase(base)
	check := func(i int, r Result) {
		t.Helper()
		want, _, wantErr := w.ref.Apply(applied[i])
		if r.Err != nil || wantErr != nil {
			t.Fatalf("command %d: err %v, reference err %v", i, r.Err, wantErr)
		}
		if !reflect.DeepEqual(r.Reply, want) {
			t.Fatalf("command %d: reply\n%+v\nreference\n%+v", i, r.Reply, want)
		}
	}
	check(0, c.apply(proposed[0])[0])
	w.check(c.converge())
	old := c.leader()
	for i, nd := range c.nodes {
		if nd == old {
			c.shutdown(i)
		}
	}
	// The next leader's clock is 8 s behind: one command alone, then two
	// in one entry, then one after its clock has passed the first's.
	check(1, c.apply(proposed[1])[0])
	for i, r := range c.apply(proposed[2:4]...) {
		check(2+i, r)
	}
	wait := c.apply(proposed[4])[0]
	check(4, wait)
	w.check(c.converge())
	if r := wait.Reply.(*ledger.ReserveReply); r.Keys[0].Status != ledger.StatusOK || r.Keys[0].Wait <= 0 {
		t.Fatalf("the last reservation: %+v, want a wait", r.Keys[0])
	}
}
