package report

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/rationhq/ration/sim/engine"
)

// passing is a leased zipf row at 2× on 8 instances that meets every
// target; each case below changes it.
func passing() *engine.Result {
	return &engine.Result{
		Scenario: "zipf", Strategy: engine.Leased, Instances: 8, Overload: 2,
		Duration:    5 * time.Minute,
		InstOffered: []int64{9, 8, 7, 6, 5, 4, 3, 2},
		WaitedFrac:  0.01, CallsPerAdmit: 0.02,
		// 8 pairs active in each of 150 refresh intervals, each activated once.
		KeyGrantsPerSec: 3.9, ActivePairs: 8, Refresh: 2 * time.Second, PairIntervals: 1200, PairActivations: 8, KeyGrantsPerActivation: 146.25,
		VsIdeal: 0.995, Jain: 0.99, IdealJain: 1,
		Budgets:  []engine.BudgetResult{{Name: "sim-key", Capacity: 6000, OverLimit: 0.001, OverLease: -0.17, OverLimitGranted: 0.001, OverLeaseGranted: -0.17}},
		Refusals: 1000, RetryLate: 0.1, RetryErrP50: 5 * time.Millisecond,
		IdleChecks: 8,
	}
}

// client is a leased row of the client alone on 8 gateways that meets
// every target stated for it (the ideal admits every retry).
func client(r *engine.Result) {
	r.Scenario, r.Overload, r.Retries, r.RetriesAdmitted, r.RetriesIdeal = "client", 0, 100, 95, 100
}

// loaded is client beside other traffic at 2×, where the ideal admits
// ideal of the client's 100 retries and early were sent early.
func loaded(r *engine.Result, admitted, ideal, early int64) {
	client(r)
	r.Scenario, r.Overload, r.RetriesAdmitted, r.RetriesIdeal, r.RetriesEarly = "client-load", 2, admitted, ideal, early
}

// TestCheckTargets: each target passes, misses or does not apply as the
// targets state it.
func TestCheckTargets(t *testing.T) {
	const pass, miss, na = "PASS", "MISS", "-"
	for _, tc := range []struct {
		name   string
		edit   func(r *engine.Result)
		target string
		want   string
	}{
		{"passing row", func(*engine.Result) {}, "", pass},

		{"waited 0.9% at 0.8×", func(r *engine.Result) { r.Overload, r.WaitedFrac = 0.8, 0.009 }, "waited", pass},
		{"waited 1.1% at 0.8×", func(r *engine.Result) { r.Overload, r.WaitedFrac = 0.8, 0.011 }, "waited", miss},
		{"waited 4.9% at 5×", func(r *engine.Result) { r.Overload, r.WaitedFrac = 5, 0.049 }, "waited", pass},
		{"waited 5.1% at 2×", func(r *engine.Result) { r.WaitedFrac = 0.051 }, "waited", miss},
		{"waited 4% at 1×", func(r *engine.Result) { r.Overload, r.WaitedFrac = 1, 0.04 }, "waited", pass},

		{"calls 0.031 on 8 at 2×", func(r *engine.Result) { r.CallsPerAdmit = 0.031 }, "calls/adm", miss},
		{"calls 0.19 on 64 at 2×", func(r *engine.Result) { r.Instances, r.CallsPerAdmit = 64, 0.19 }, "calls/adm", pass},
		{"calls 0.21 on 64 at 2×", func(r *engine.Result) { r.Instances, r.CallsPerAdmit = 64, 0.21 }, "calls/adm", miss},
		{"calls on 8 at 5×: no target", func(r *engine.Result) { r.Overload, r.CallsPerAdmit = 5, 3 }, "calls/adm", na},
		{"calls on 16 at 2×: no target", func(r *engine.Result) { r.Instances, r.CallsPerAdmit = 16, 3 }, "calls/adm", na},

		{"grants 4.02/s, 1200 pair-intervals and 8 activations in 300 s", func(r *engine.Result) { r.KeyGrantsPerSec = 4.02 }, "grants/s", pass},
		{"grants 4.03/s, 1200 pair-intervals and 8 activations in 300 s", func(r *engine.Result) { r.KeyGrantsPerSec = 4.03 }, "grants/s", miss},
		{"grants 4.1/s, 1200 pair-intervals and 38 activations in 300 s", func(r *engine.Result) { r.KeyGrantsPerSec, r.PairActivations = 4.1, 38 }, "grants/s", pass},
		{"grants with no active pair", func(r *engine.Result) { r.PairIntervals = 0 }, "grants/s", na},

		{"zipf 98.9% of the ideal", func(r *engine.Result) { r.VsIdeal = 0.989 }, "vs ideal", miss},
		{"rotating 98.5% of the ideal", func(r *engine.Result) { r.Scenario, r.VsIdeal = "rotating", 0.985 }, "vs ideal", pass},
		{"autoscale 97.9% of the ideal", func(r *engine.Result) { r.Scenario, r.VsIdeal = "autoscale", 0.979 }, "vs ideal", miss},
		{"moving 98.5% of the ideal", func(r *engine.Result) { r.Scenario, r.VsIdeal = "moving", 0.985 }, "vs ideal", miss},

		{"Jain 0.94, the ideal's 1", func(r *engine.Result) { r.Jain = 0.94 }, "Jain", miss},
		{"Jain 0.90, the ideal's 0.905", func(r *engine.Result) { r.Jain, r.IdealJain = 0.90, 0.905 }, "Jain", pass},
		{"Jain 0.89, the ideal's 0.905", func(r *engine.Result) { r.Jain, r.IdealJain = 0.89, 0.905 }, "Jain", miss},
		{"Jain 0.5 with an idle instance", func(r *engine.Result) { r.Jain, r.InstOffered[7] = 0.5, 0 }, "Jain", na},

		{"tokens 97% of the ideal, the best split's 96%", func(r *engine.Result) { r.Scenario, r.VsIdeal, r.SplitVsIdeal = "tokens", 0.97, 0.96 }, "vs ideal", pass},
		{"tokens 95% of the ideal, the best split's 96%", func(r *engine.Result) { r.Scenario, r.VsIdeal, r.SplitVsIdeal = "tokens", 0.95, 0.96 }, "vs ideal", miss},

		{"client on 8: 95% of retries admitted", client, "retries", pass},
		{"client on 8: 94%", func(r *engine.Result) { client(r); r.RetriesAdmitted = 94 }, "retries", miss},
		{"client on 8: no retry", func(r *engine.Result) { client(r); r.Retries, r.RetriesAdmitted = 0, 0 }, "retries", miss},
		{"client on 1: 95%", func(r *engine.Result) { client(r); r.Instances = 1 }, "retries", pass},
		{"client on 64: no target", func(r *engine.Result) { client(r); r.Instances, r.RetriesAdmitted = 64, 10 }, "retries", na},
		{"client-day on 8: 94%", func(r *engine.Result) { client(r); r.Scenario, r.RetriesAdmitted = "client-day", 94 }, "retries", miss},
		{"client-load on 64 at 2×: 90%", func(r *engine.Result) {
			client(r)
			r.Scenario, r.Instances, r.Overload, r.RetriesAdmitted = "client-load", 64, 2, 90
		}, "retries", pass},
		{"client-load on 8 at 2×: 89%", func(r *engine.Result) { loaded(r, 89, 100, 0) }, "retries", miss},
		{"client-load on 8 at 2×: 89%, the ideal 90%", func(r *engine.Result) { loaded(r, 89, 90, 0) }, "retries", pass},
		{"client-load on 8 at 2×: 88%, the ideal 90%", func(r *engine.Result) { loaded(r, 88, 90, 0) }, "retries", miss},
		{"client-load on 8 at 2×: 19%, the ideal 19%, 80 sent early", func(r *engine.Result) { loaded(r, 19, 19, 80) }, "retries", miss},
		{"client-load on 8 at 2×: 90%, 1 sent early", func(r *engine.Result) { loaded(r, 90, 100, 1) }, "retries", pass},
		{"client-load on 8 at 5×: no target", func(r *engine.Result) { client(r); r.Scenario, r.Overload, r.RetriesAdmitted = "client-load", 5, 10 }, "retries", na},
		{"client-load on 1 at 2×: no target", func(r *engine.Result) {
			client(r)
			r.Scenario, r.Instances, r.Overload, r.RetriesAdmitted = "client-load", 1, 2, 10
		}, "retries", na},
		{"retries in zipf: no target", func(r *engine.Result) { r.Retries, r.RetriesAdmitted = 100, 10 }, "retries", na},

		{"half the refusals late", func(r *engine.Result) { r.RetryLate = 0.5 }, "Retry-After", pass},
		{"51% of the refusals late", func(r *engine.Result) { r.RetryLate = 0.51 }, "Retry-After", miss},
		{"client: 51% late", func(r *engine.Result) { client(r); r.RetryLate = 0.51 }, "Retry-After", miss},
		{"no refusal", func(r *engine.Result) { r.Refusals = 0 }, "Retry-After", na},

		{"an idle gateway still holding", func(r *engine.Result) { r.IdleHolding, r.IdleKeys = 1, 1 }, "idle held", miss},
		{"client: an idle gateway still holding", func(r *engine.Result) { client(r); r.IdleHolding, r.IdleShares = 1, 1 }, "idle held", miss},
		{"no gateway went idle", func(r *engine.Result) { r.IdleChecks = 0 }, "idle held", na},

		{"leased: granted past C+ρ(t+TTL)", func(r *engine.Result) { r.Budgets[0].OverLeaseGranted = 0.001 }, "bound", miss},
		{"strict: past C+ρt", func(r *engine.Result) { r.Strategy = engine.LeasedStrict }, "bound", miss},
		{"strict: within C+ρt", func(r *engine.Result) {
			r.Strategy, r.Budgets[0].OverLimit, r.Budgets[0].OverLimitGranted = engine.LeasedStrict, -0.05, -0.05
		}, "bound", pass},
		{"outage: past the bound by less than the fallback debt", func(r *engine.Result) {
			r.Scenario, r.Budgets[0].OverLease, r.Budgets[0].FallbackUnits = "outage", 0.05, 600
		}, "bound", pass},
		{"outage: past the bound by more than the fallback debt", func(r *engine.Result) {
			r.Scenario, r.Budgets[0].OverLease, r.Budgets[0].FallbackUnits = "outage", 0.15, 600
		}, "bound", miss},
		{"a second budget past its bound", func(r *engine.Result) {
			r.Budgets = append(r.Budgets, engine.BudgetResult{Name: "team", Capacity: 100, OverLeaseGranted: 0.01, OverLease: 0.01})
		}, "bound", miss},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := passing()
			tc.edit(r)
			vs := Check([]*engine.Result{r})
			if len(vs) != 1 {
				t.Fatalf("%d verdicts, want 1", len(vs))
			}
			v := vs[0]
			for i, tg := range Targets() {
				c := v.Cells[i]
				got := strings.Fields(c.String())[0]
				want := pass
				if tg.Name == tc.target {
					want = tc.want
				} else if !c.Applies {
					want = na // only the calls target is stated for some rows alone
				}
				if got != want {
					t.Errorf("%s: %q, want %s", tg.Name, c, want)
				}
			}
			missed := v.Missed()
			if tc.want == miss && (len(missed) != 1 || missed[0] != tc.target) || tc.want != miss && len(missed) != 0 {
				t.Errorf("Missed() = %v", missed)
			}
		})
	}
}

// TestCheckSkipsRowsWithoutTargets: only leased and leased-strict rows of
// the checked scenarios are checked.
func TestCheckSkipsRowsWithoutTargets(t *testing.T) {
	var rs []*engine.Result
	for _, e := range []struct {
		sc string
		st engine.Strategy
	}{{"zipf", engine.Static}, {"zipf", engine.Central}, {"team", engine.Leased}, {"tokens-io", engine.LeasedStrict}, {"moving", engine.LeasedStrict}, {"tokens", engine.Leased},
		{"client", engine.Sticky}, {"client-day", engine.Leased}} {
		r := passing()
		r.Scenario, r.Strategy = e.sc, e.st
		rs = append(rs, r)
	}
	vs := Check(rs)
	if len(vs) != 3 || vs[0].Result.Scenario != "moving" || vs[1].Result.Scenario != "tokens" || vs[2].Result.Scenario != "client-day" {
		t.Fatalf("checked %d rows, want moving, tokens and client-day", len(vs))
	}
}

// TestCheckTable: one row per verdict with PASS or MISS per target, the
// rows that miss named, and a count per target.
func TestCheckTable(t *testing.T) {
	good, bad := passing(), passing()
	bad.Overload, bad.WaitedFrac, bad.Jain, bad.IdealJain = 0.8, 0.2, 0.5, 0.7
	var b bytes.Buffer
	missed, err := CheckTable(&b, Check([]*engine.Result{good, bad}), true)
	if err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{
		"| scenario | strategy | N | load | waited | calls/adm | grants/s | vs ideal | Jain | bound | retries | Retry-After | idle held | verdict |",
		"| zipf | leased | 8 | 2× | PASS 1.00% | PASS 0.0200 | PASS 3.90/s ≤ 4.03/s (146.25 per activation) | PASS 99.50% | PASS 0.990 (ideal 1.000) | PASS granted (-17%C) | - | PASS 10.00% late (p50 +5.0ms) | PASS 0 of 8 | PASS |",
		"| zipf | leased | 8 | 0.8× | MISS 20.00% > 1.00% | - | PASS 3.90/s ≤ 4.03/s (146.25 per activation) | PASS 99.50% | MISS 0.500 < 0.690 (ideal 0.700) | PASS granted (-17%C) | - | PASS 10.00% late (p50 +5.0ms) | PASS 0 of 8 | MISS waited, Jain |",
		"check: 1 of 2 rows miss a target; waited 1; calls/adm 0; grants/s 0; vs ideal 0; Jain 1; bound 0; retries 0; Retry-After 0; idle held 0",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("the check table lacks %q:\n%s", want, out)
		}
	}
	if missed != 1 {
		t.Errorf("missed = %d, want 1", missed)
	}
}
