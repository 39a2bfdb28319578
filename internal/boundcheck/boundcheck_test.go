package boundcheck_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/rationhq/ration/allocator/ledger"
	"github.com/rationhq/ration/internal/boundcheck"
	"github.com/rationhq/ration/internal/fakeclock"
)

// failed is what a model reported to recordingT.Fatalf.
type failed struct{ msg string }

// recordingT draws like a Seeded and stops the run with a failed panic
// where Seeded would fail the test, so that a test can expect a failure.
type recordingT struct{ *boundcheck.Seeded }

func (recordingT) Fatalf(format string, args ...any) { panic(failed{fmt.Sprintf(format, args...)}) }

// stateLedger applies the model's calls to a ledger.State: an honest
// ledger. Its mint, grantAll and freshRetry break one rule each.
type stateLedger struct {
	st  *ledger.State
	clk *fakeclock.Clock

	mint       bool // credit every return claimed, beyond the holding
	grantAll   bool // grant every Want, whatever the bucket holds
	freshRetry bool // answer a retry with a reply of its own
	answered   map[ledger.Caller]bool
}

func (l *stateLedger) Send(s *boundcheck.Spender, c *boundcheck.Call) (any, bool) {
	r, _, err := l.st.Apply(c.Command(ledger.InstantOf(l.clk.Now())))
	if err != nil {
		panic(fmt.Sprintf("apply: %v", err))
	}
	if ar, ok := r.(*ledger.AcquireReply); ok {
		cp := *ar
		cp.Keys = append([]ledger.AcquireResult(nil), ar.Keys...)
		for i, k := range c.Acquire {
			if l.grantAll {
				g := k.Want.Max(k.Need)
				cp.Keys[i].Status, cp.Keys[i].Granted, cp.Keys[i].Held = ledger.StatusOK, g, k.Held.Add(g)
			}
			if l.mint {
				cp.Keys[i].Returned = k.Returned
			}
		}
		if l.freshRetry && l.answered[c.Caller] {
			cp.Keys[0].Held.Tokens++
		}
		l.answered[c.Caller] = true
		return &cp, true
	}
	return r, true
}

func (l *stateLedger) Release(c ledger.Caller, keys []ledger.ReleaseKey) *ledger.ReleaseReply {
	r, _, err := l.st.Apply(ledger.Release{Now: ledger.InstantOf(l.clk.Now()), Caller: c, Keys: keys})
	if err != nil {
		panic(fmt.Sprintf("release: %v", err))
	}
	rr := r.(*ledger.ReleaseReply)
	if l.mint {
		for i, k := range keys {
			rr.Returned[i] = k.Returned
		}
	}
	return rr
}

// run drives three spenders (the third a liar) against l for steps steps
// from seed, checking the bound after each, and returns the first failure
// ("" if none).
func run(t *testing.T, l *stateLedger, seed uint64, strict bool, steps int) (msg string) {
	t.Helper()
	st, err := ledger.New(ledger.Config{TTL: boundcheck.TTL, Strict: strict, Retention: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	l.st, l.clk, l.answered = st, fakeclock.New(), map[ledger.Caller]bool{}
	r := recordingT{boundcheck.NewSeeded(t, seed)}
	m := boundcheck.New(r, l.clk, strict, l)
	for i := range 3 {
		m.AddSpender(fmt.Sprintf("s%d", i), i == 2)
	}
	sp := m.Spenders()
	pick := func() *boundcheck.Spender { return sp[r.IntRange(0, len(sp)-1, "who")] }
	defer func() {
		if f, ok := recover().(failed); ok {
			msg = f.msg
		}
	}()
	for range steps {
		switch r.IntRange(0, 9, "step") {
		case 0, 1:
			m.Advance(time.Duration(r.Int64Range(0, 15_000, "ms")) * time.Millisecond)
		case 2, 3, 4:
			m.Acquire(pick())
		case 5:
			m.Reserve(pick())
		case 6, 7:
			m.Consume()
		case 8:
			m.Retry(pick())
		case 9:
			m.Release(pick())
		}
		m.Check()
	}
	return ""
}

// The checks pass on the ledger, and each catches the rule it stands for
// broken: grants beyond the bucket break the bound, credits beyond the
// holding mint, a retry answered afresh is not the stored reply. (A run
// may not meet the broken rule: a retry needs a lost reply first.)
func TestModelChecks(t *testing.T) {
	const seeds = 20
	for _, tc := range []struct {
		name    string
		l       stateLedger
		want    string // in every failure; "" for none
		atLeast int    // runs that fail, of 2 × seeds
	}{
		{"honest ledger", stateLedger{}, "", 0},
		{"grants beyond the bucket", stateLedger{grantAll: true}, "bound broken", 2 * seeds},
		{"credits beyond the holding", stateLedger{mint: true}, "exceeds holding", 2 * seeds},
		{"a retry answered afresh", stateLedger{freshRetry: true}, "retry reply", seeds},
	} {
		t.Run(tc.name, func(t *testing.T) {
			failures := 0
			for seed := range uint64(seeds) {
				for _, strict := range []bool{false, true} {
					l := tc.l
					got := run(t, &l, seed, strict, 200)
					if got == "" {
						continue
					}
					failures++
					if tc.want == "" || !strings.Contains(got, tc.want) {
						t.Fatalf("seed %d, strict %v: failure %q, want %q", seed, strict, got, tc.want)
					}
				}
			}
			if failures < tc.atLeast {
				t.Fatalf("%d runs of %d failed, want at least %d", failures, 2*seeds, tc.atLeast)
			}
		})
	}
}

// The same seed gives the same draws; another seed others.
func TestSeededRepeats(t *testing.T) {
	draw := func(seed uint64) []int64 {
		s := boundcheck.NewSeeded(t, seed)
		var out []int64
		for range 100 {
			out = append(out, s.Int64Range(-5, 1_000_000, ""), int64(s.IntRange(0, 3, "")))
			a := s.Amount(400, "")
			out = append(out, a.Requests, a.Tokens)
		}
		return out
	}
	a, b, c := draw(7), draw(7), draw(8)
	if fmt.Sprint(a) != fmt.Sprint(b) {
		t.Fatal("seed 7 drew twice differently")
	}
	if fmt.Sprint(a) == fmt.Sprint(c) {
		t.Fatal("seeds 7 and 8 drew the same")
	}
}

// Draws stay in their ranges, reach both ends, and an amount's requests
// are at most a tenth of its tokens' maximum plus one.
func TestSeededRanges(t *testing.T) {
	s := boundcheck.NewSeeded(t, 1)
	for _, r := range []struct{ lo, hi int64 }{{0, 0}, {0, 1}, {3, 9}, {-7, 7}, {0, 15_000}, {0, 1 << 40}} {
		sawLo, sawHi := false, false
		for range 2000 {
			v := s.Int64Range(r.lo, r.hi, "")
			if v < r.lo || v > r.hi {
				t.Fatalf("Int64Range(%d, %d) = %d", r.lo, r.hi, v)
			}
			sawLo, sawHi = sawLo || v == r.lo, sawHi || v == r.hi
		}
		if !sawLo || !sawHi {
			t.Fatalf("Int64Range(%d, %d): lo seen %v, hi seen %v in 2000 draws", r.lo, r.hi, sawLo, sawHi)
		}
	}
	for range 2000 {
		a := s.Amount(400, "")
		if a.Requests < 0 || a.Requests > 41 || a.Tokens < 0 || a.Tokens > 400 {
			t.Fatalf("Amount(400) = %+v", a)
		}
	}
}
