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
		InstOffered: []int64{9, 8, 7, 6, 5, 4, 3, 2},
		WaitedFrac:  0.01, CallsPerAdmit: 0.02,
		KeyGrantsPerSec: 3.9, ActivePairs: 8, Refresh: 2 * time.Second,
		VsIdeal: 0.995, Jain: 0.99, IdealJain: 1,
		Budgets: []engine.BudgetResult{{Name: "sim-key", Capacity: 6000, OverLimit: 0.001, OverLease: -0.17, OverLimitGranted: 0.001, OverLeaseGranted: -0.17}},
	}
}

// TestCheckTargets: each target passes, misses or does not apply as the
// issue states it.
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

		{"grants 4.0/s, 8 pairs, 2 s", func(r *engine.Result) { r.KeyGrantsPerSec = 4 }, "grants/s", pass},
		{"grants 4.1/s, 8 pairs, 2 s", func(r *engine.Result) { r.KeyGrantsPerSec = 4.1 }, "grants/s", miss},
		{"grants 4.1/s, 8 pairs, 1 s", func(r *engine.Result) { r.KeyGrantsPerSec, r.Refresh = 4.1, time.Second }, "grants/s", pass},
		{"grants with no active pair", func(r *engine.Result) { r.ActivePairs = 0 }, "grants/s", na},

		{"zipf 98.9% of the ideal", func(r *engine.Result) { r.VsIdeal = 0.989 }, "vs ideal", miss},
		{"rotating 98.5% of the ideal", func(r *engine.Result) { r.Scenario, r.VsIdeal = "rotating", 0.985 }, "vs ideal", pass},
		{"autoscale 97.9% of the ideal", func(r *engine.Result) { r.Scenario, r.VsIdeal = "autoscale", 0.979 }, "vs ideal", miss},
		{"moving 98.5% of the ideal", func(r *engine.Result) { r.Scenario, r.VsIdeal = "moving", 0.985 }, "vs ideal", miss},

		{"Jain 0.94", func(r *engine.Result) { r.Jain = 0.94 }, "Jain", miss},
		{"Jain 0.5 with an idle instance", func(r *engine.Result) { r.Jain, r.InstOffered[7] = 0.5, 0 }, "Jain", na},

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
	}{{"zipf", engine.Static}, {"zipf", engine.Central}, {"team", engine.Leased}, {"tokens-io", engine.LeasedStrict}, {"moving", engine.LeasedStrict}, {"tokens", engine.Leased}} {
		r := passing()
		r.Scenario, r.Strategy = e.sc, e.st
		rs = append(rs, r)
	}
	vs := Check(rs)
	if len(vs) != 2 || vs[0].Result.Scenario != "moving" || vs[1].Result.Scenario != "tokens" {
		t.Fatalf("checked %d rows, want moving and tokens", len(vs))
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
		"| scenario | strategy | N | load | waited | calls/adm | grants/s | vs ideal | Jain | bound | verdict |",
		"| zipf | leased | 8 | 2× | PASS 1.00% | PASS 0.0200 | PASS 3.90/s ≤ 4.00/s | PASS 99.50% | PASS 0.990 (ideal 1.000) | PASS granted (-17%C) | PASS |",
		"| zipf | leased | 8 | 0.8× | MISS 20.00% > 1.00% | - | PASS 3.90/s ≤ 4.00/s | PASS 99.50% | MISS 0.500 < 0.950 (ideal 0.700) | PASS granted (-17%C) | MISS waited, Jain |",
		"check: 1 of 2 rows miss a target; waited 1; calls/adm 0; grants/s 0; vs ideal 0; Jain 1; bound 0",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("the check table lacks %q:\n%s", want, out)
		}
	}
	if missed != 1 {
		t.Errorf("missed = %d, want 1", missed)
	}
}
