//go:build faults

package faults

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/rationhq/ration/allocator/cluster"
	"github.com/rationhq/ration/allocator/ledger"
	"github.com/rationhq/ration/bucket"
)

// The suite's own checks, on made-up runs: each must find what it is there
// to find, or the cases that rely on it prove nothing.

// t0 is the made-up runs' start.
var t0 = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)

func at(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }

// TestFallbackLogBounds: atMost is the first sample read wholly after an
// instant, atLeast the last read wholly before it.
func TestFallbackLogBounds(t *testing.T) {
	l := &fallbackLog{samples: []fallbackSample{{at(0), at(0.1), 0}, {at(1), at(1.1), 5}, {at(2), at(2.1), 9}}}
	for _, c := range []struct {
		at      float64
		most    float64
		mostOK  bool
		atLeast float64
	}{
		{0.05, 5, true, 0},
		{0.5, 5, true, 0},
		{1, 5, true, 0},
		{1.05, 9, true, 0},
		{1.1, 9, true, 5},
		{2.5, 0, false, 9},
	} {
		most, ok := l.atMost(at(c.at))
		if most != c.most || ok != c.mostOK || l.atLeast(at(c.at)) != c.atLeast {
			t.Errorf("at %.2f s: atMost %v %v, atLeast %v; want %v %v, %v", c.at, most, ok, l.atLeast(at(c.at)), c.most, c.mostOK, c.atLeast)
		}
	}
}

// TestEveryWindowFindsOverAdmission: a key of C = 60, ρ = 1 a second, TTL
// 2 s, admitting its burst and then ρ passes; 60 more admissions at 10 s
// (a failover that forgot the key's state and granted a fresh bucket) are
// found in the windows spanning 10 s, unless they were fallback
// admissions; a burst above C + ρ·TTL is found at once; the fallback
// samples must cover the run.
func TestEveryWindowFindsOverAdmission(t *testing.T) {
	steady := func() []span {
		var s []span
		for i := range 60 {
			s = append(s, span{at(0.1 + float64(i)/100), at(0.12 + float64(i)/100)})
		}
		for i := 1; i <= 20; i++ {
			s = append(s, span{at(float64(i)), at(float64(i) + 0.02)})
		}
		return s
	}
	minted := func() []span {
		s := steady()
		for i := range 60 {
			s = append(s, span{at(10.1 + float64(i)/200), at(10.12 + float64(i)/200)})
		}
		return s
	}
	none := []fallbackSample{{at(-0.1), at(-0.05), 0}, {at(25), at(25.1), 0}}
	fallback60 := []fallbackSample{{at(-0.1), at(-0.05), 0}, {at(9.9), at(9.95), 0}, {at(10.6), at(10.65), 60}, {at(25), at(25.1), 60}}
	fault := []fault{{"at 10 s", at(10), at(10.5)}, {"after the last admission", at(20.5), at(21)}}
	for _, c := range []struct {
		name     string
		admits   []span
		fallback []fallbackSample
		violates bool   // some window over its limit
		spanned  bool   // and one spanning the fault
		err      string // checkEveryWindow's error
	}{
		{name: "steady", admits: steady(), fallback: none},
		{name: "a fresh bucket at 10 s", admits: minted(), fallback: none, violates: true, spanned: true},
		{name: "the same under fallback", admits: minted(), fallback: fallback60},
		{name: "a burst over C + ρ·TTL", admits: append(steady(), span{at(0.5), at(0.6)}, span{at(0.5), at(0.6)}, span{at(0.5), at(0.6)}),
			fallback: none, violates: true, spanned: true}, // the windows from the start span 10 s too
		{name: "no sample after the run", admits: steady(), fallback: none[:1], err: "no fallback sample"},
	} {
		t.Run(c.name, func(t *testing.T) {
			r, err := checkEveryWindow(windows{rpm: 60, ttl: 2 * time.Second, start: t0, end: at(22), admits: c.admits,
				fallback: c.fallback, faults: fault})
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("error %v, want %q", err, c.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := len(r.violations) > 0; got != c.violates {
				t.Errorf("violations %v, want some: %v (tightest: %v)", r.violations, c.violates, r.tightest)
			}
			if got := r.perFault[0].margin() < 0; got != c.spanned {
				t.Errorf("tightest window spanning the fault: %v, want over its limit: %v", r.perFault[0], c.spanned)
			}
			if math.IsInf(r.perFault[1].limit, 1) {
				t.Errorf("no window spans a fault after the last admission; the windows to the run's end do")
			}
			if n := len(c.admits); r.windows < n*n/4 {
				t.Errorf("%d windows checked for %d admissions", r.windows, n)
			}
		})
	}
}

// TestReplayCountsAppliedTwice: replay.count tells a call applied (it
// changed its spender's record), one answered from its stored reply
// (changed nothing), one refused and a release apart, and reports a call
// applied a second time.
func TestReplayCountsAppliedTwice(t *testing.T) {
	acq := func(seq uint64, now float64) ledger.Command {
		return ledger.Acquire{Now: ledger.InstantOf(at(now)), Caller: ledger.Caller{SpenderID: "s", Epoch: 1, Sequence: seq}}
	}
	applied := cluster.Result{Changed: ledger.Changes{Keys: []string{"k"}, Sessions: []string{"s"}}}
	r := &replay{applied: map[call]bucket.Instant{}}
	r.count(1, acq(1, 1), applied)
	r.count(2, acq(1, 2), cluster.Result{})                                  // the retry, answered from the record
	r.count(3, acq(2, 3), applied)                                           // the next call
	r.count(4, acq(1, 4), cluster.Result{Err: errors.New("stale sequence")}) // refused
	r.count(5, ledger.Release{Caller: ledger.Caller{SpenderID: "s", Epoch: 1, Sequence: 3}}, applied)
	r.count(6, ledger.Sweep{}, cluster.Result{Changed: ledger.Changes{Sessions: []string{"s"}}})
	if len(r.twice) != 0 || len(r.applied) != 2 || r.retried != 1 || r.refused != 1 || r.released != 1 {
		t.Fatalf("got %v, twice %v", r, r.twice)
	}
	if got := fmt.Sprint(r.appliedBy("s", at(2)), r.appliedBy("s", at(3.5)), r.appliedBy("other", at(9))); got != "1 2 0" {
		t.Errorf("appliedBy: %s, want 1 2 0", got)
	}
	r.count(7, acq(2, 7), applied) // applied again: its grant taken twice
	if len(r.twice) != 1 || !strings.Contains(r.twice[0], "sequence 2 again at index 7") {
		t.Errorf("twice %v, want sequence 2 again at index 7", r.twice)
	}
}
