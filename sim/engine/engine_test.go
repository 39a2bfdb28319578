package engine

import (
	"context"
	"fmt"
	"math"
	"reflect"
	"testing"
	"time"

	"github.com/rationhq/ration"
	leasev1 "github.com/rationhq/ration/proto/ration/lease/v1"
	"github.com/rationhq/ration/spender"
)

func mustRun(t *testing.T, cfg Config) *Result {
	t.Helper()
	r, err := Run(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func scenario(t *testing.T, name string) Scenario {
	t.Helper()
	sc, err := ScenarioByName(name)
	if err != nil {
		t.Fatal(err)
	}
	return sc
}

// TestStaticSplitSeed004 reproduces the static split's proposition (docs/sim.md): a limit R
// split statically as R/N over N instances, with traffic fractions f_i
// offered at exactly R, admits R * sum(min(f_i, 1/N)) in the long run.
// The simulated rate over the second half of a 10-minute run (every
// overloaded instance's bucket has drained by then) must be within 2%.
func TestStaticSplitSeed004(t *testing.T) {
	for _, tc := range []struct {
		sc Scenario
		n  int
	}{
		{FixedSkew("even", 1, 1, 1, 1), 4},
		{FixedSkew("60-20-10-10", 0.6, 0.2, 0.1, 0.1), 4},
		{FixedSkew("one-hot", 1, 0, 0, 0), 4},
		{scenario(t, "zipf"), 8},
		{FixedSkew("two-of-eight", 0.5, 0.5, 0, 0, 0, 0, 0, 0), 8},
	} {
		t.Run(tc.sc.Name, func(t *testing.T) {
			want := 0.0
			for _, f := range tc.sc.Shares(tc.n) {
				want += min(f, 1/float64(tc.n))
			}
			r := mustRun(t, Config{Scenario: tc.sc, Strategy: Static, Instances: tc.n, Duration: 10 * time.Minute, Overload: 1, Seed: 4})
			if math.Abs(r.Steady-want) > 0.02*want {
				t.Fatalf("static split admitted %.4f R, the proposition predicts R*sum(min(f_i, 1/N)) = %.4f R", r.Steady, want)
			}
			t.Logf("admitted %.4f R, predicted %.4f R", r.Steady, want)
		})
	}
}

// skewScenarios are the scenarios where only the split of traffic across
// instances differs.
// (team, where the keys' traffic is skewed too, is in
// TestEveryBudgetTracksTheIdeal.)
var skewScenarios = []string{"uniform", "zipf", "one", "rotating", "bursts", "autoscale"}

// TestLeasedTracksTheLimitUnderSkew: under every skew, at twice the
// limit, both leased variants admit at least 97% of what the limit allows
// (C + rho*t) and every instance sees nearly the same admission
// probability (Jain's index at least 0.95).
func TestLeasedTracksTheLimitUnderSkew(t *testing.T) {
	for _, name := range skewScenarios {
		for _, st := range []Strategy{Leased, LeasedStrict} {
			t.Run(name+"/"+string(st), func(t *testing.T) {
				t.Parallel()
				r := mustRun(t, Config{Scenario: scenario(t, name), Strategy: st, Duration: 2 * time.Minute, Seed: 7})
				if r.AdmitFrac < 0.97 {
					t.Errorf("admitted %.0f of %.0f allowed (%.2f%%), want at least 97%%", r.AdmittedUnits, r.Allowed, 100*r.AdmitFrac)
				}
				if r.Jain < 0.95 {
					t.Errorf("Jain's index %.3f (probabilities %.3f to %.3f), want at least 0.95", r.Jain, r.MinProb, r.MaxProb)
				}
				// The ideal's per-instance counts are its admissions, every
				// one (a request costs one unit of the one key here).
				var ideal int64
				for _, n := range r.InstIdeal {
					ideal += n
				}
				if float64(ideal) != r.Budgets[0].IdealUnits || r.IdealJain <= 0 || r.IdealJain > 1 {
					t.Errorf("the ideal admitted %d by instance, %.0f in all; its Jain's index %.3f", ideal, r.Budgets[0].IdealUnits, r.IdealJain)
				}
				t.Logf("admitted %.2f%% of C+rho*t, Jain %.3f (the ideal's %.3f), %.3f calls per admission", 100*r.AdmitFrac, r.Jain, r.IdealJain, r.CallsPerAdmit)
			})
		}
	}
}

// TestBoundsHold: in every scenario and for every budget a request is
// charged to, what the leased variants admit from grants never exceeds
// their documented bound in any window (default C + rho*(t+TTL), strict
// C + rho*t, each budget's own C and rho; the simulator's traffic has no
// overruns), and all they admit, fallback included, stays within the
// bound plus what was admitted under the fallback policy (reported as
// debt). Central, an exact strict bucket, stays within C + rho*t (checked
// on two scenarios here and on team in TestEveryBudgetTracksTheIdeal: its
// per-request calls make it the slowest to simulate). And every time a
// leased gateway has gone a TTL without a request, it holds nothing.
func TestBoundsHold(t *testing.T) {
	for _, sc := range Scenarios() {
		for _, st := range []Strategy{Leased, LeasedStrict, Central} {
			if st == Central && sc.Name != "zipf" && sc.Name != "lossy" {
				continue
			}
			t.Run(sc.Name+"/"+string(st), func(t *testing.T) {
				t.Parallel()
				r := mustRun(t, Config{Scenario: sc, Strategy: st, Duration: 90 * time.Second, Seed: 11})
				for _, b := range r.Budgets {
					over, all := b.OverLeaseGranted, b.OverLease
					bound := "C + rho*(t+TTL)"
					if st != Leased {
						over, all, bound = b.OverLimitGranted, b.OverLimit, "C + rho*t"
					}
					if over > 0 {
						t.Errorf("budget %s: admissions from grants exceeded %s by %.2f%% of C", b.Name, bound, 100*over)
					}
					if debt := b.FallbackUnits / float64(b.Capacity); all > debt {
						t.Errorf("budget %s: all admissions exceeded %s by %.2f%% of C, more than the %.2f%% of C admitted in fallback", b.Name, bound, 100*all, 100*debt)
					}
					t.Logf("budget %s: worst window vs %s: %+.2f%% of C from grants, %+.2f%% of C in all", b.Name, bound, 100*over, 100*all)
				}
				if r.AllocErrors > 0 {
					t.Errorf("the allocator refused %d calls", r.AllocErrors)
				}
				busy := int64(0) // gateways offered a request: each is checked after its last
				for _, n := range r.InstOffered {
					if n > 0 {
						busy++
					}
				}
				if st != Central && (r.IdleHolding > 0 || r.IdleChecks < busy) {
					// The client contract: a TTL after its last request
					// ended a gateway holds nothing (central's slots are
					// not gateways' spenders: a reply lost after its grant
					// leaves that grant held). Every gateway offered a
					// request is checked at least once, after the traffic.
					t.Errorf("%d of %d times a gateway went a TTL since its last request it still held budget (%d with spender keys, %d with shares, up to %.0f units); %d gateways were offered requests, each checked at least once",
						r.IdleHolding, r.IdleChecks, r.IdleKeys, r.IdleShares, r.IdleHeld, busy)
				}
				t.Logf("%d fallback admissions; %d idle checks", r.Fallback, r.IdleChecks)
			})
		}
	}
}

// TestEveryBudgetTracksTheIdeal: where each request is charged to several
// budgets (a key and its team; input and output tokens), every budget,
// each key's and the team's alike, admits close to what one exact bucket
// per budget admits from the same arrivals, with nothing admitted past
// any budget's bound (TestBoundsHold checks the same runs' windows; here
// there is no fallback, the allocator being always reachable), and the
// instances see equal admission probabilities. The team binds: the keys'
// limits sum above its own, and the ideal spends the team's whole
// C + rho*T.
func TestEveryBudgetTracksTheIdeal(t *testing.T) {
	for _, tc := range []struct {
		scenario string
		st       Strategy
		rpm      int64   // the team's RPM; 0: the default
		min      float64 // each budget's admitted / ideal, at least
	}{
		{"team", Leased, 0, 0.98},
		{"team", LeasedStrict, 0, 0.97},
		// Central makes a call per request: a tenth of the rate (and of
		// the cost to simulate), the same shape. Its smallest key then
		// admits about 180 requests, and the seed alone moves each key by
		// a few percent (0.937 to 1.040 of the ideal over seeds 1 to 12).
		{"team", Central, 600, 0.93},
		{"tokens-io", Leased, 0, 0.97},
		// Strict leases cost each token budget a few percent (tokens:
		// 94% of the ideal); a request needs both, so the losses add.
		{"tokens-io", LeasedStrict, 0, 0.85},
	} {
		t.Run(tc.scenario+"/"+string(tc.st), func(t *testing.T) {
			t.Parallel()
			cfg := Config{Scenario: scenario(t, tc.scenario), Strategy: tc.st, Duration: 90 * time.Second, Seed: 11}
			if tc.rpm > 0 {
				cfg.Limits = ration.Limits{RPM: tc.rpm}
			}
			r := mustRun(t, cfg)
			if len(r.Budgets) != map[string]int{"team": TeamKeys + 1, "tokens-io": 2}[tc.scenario] {
				t.Fatalf("%d budgets", len(r.Budgets))
			}
			if r.Fallback != 0 {
				t.Errorf("%d fallback admissions with the allocator always reachable", r.Fallback)
			}
			for _, b := range r.Budgets {
				if b.VsIdeal < tc.min {
					t.Errorf("budget %s admitted %.0f, %.1f%% of the ideal's %.0f; want at least %.0f%%", b.Name, b.AdmittedUnits, 100*b.VsIdeal, b.IdealUnits, 100*tc.min)
				}
				over := b.OverLimit
				if tc.st == Leased {
					over = b.OverLease
				}
				if over > 0 {
					t.Errorf("budget %s: admissions exceeded the bound by %.2f%% of C", b.Name, 100*over)
				}
				t.Logf("budget %s: %.1f%% of C + rho*T, %.1f%% of the ideal, worst window %+.1f%% of C against the bound", b.Name, 100*b.AdmitFrac, 100*b.VsIdeal, 100*over)
			}
			if r.Jain < 0.95 {
				t.Errorf("Jain's index %.3f (probabilities %.3f to %.3f), want at least 0.95", r.Jain, r.MinProb, r.MaxProb)
			}
			if tc.scenario != "team" {
				return
			}
			team := r.Budgets[TeamKeys]
			sum := int64(0)
			for _, b := range r.Budgets[:TeamKeys] {
				sum += b.Limits.RPM
			}
			if team.Name != r.Primary || sum <= team.Limits.RPM {
				t.Fatalf("the team %s (RPM %d) is not the primary budget %s or not below the keys' sum %d", team.Name, team.Limits.RPM, r.Primary, sum)
			}
			if ideal := team.IdealUnits / team.Allowed; ideal < 0.99 {
				t.Errorf("the ideal admitted %.1f%% of the team's C + rho*T: the team does not bind", 100*ideal)
			}
		})
	}
}

// TestStickyCannotHoldATeam: sticky routing by API key gives each key's
// owner the whole team budget, so a team whose keys have different owners
// is admitted past its limit (the simulator's honest negative).
func TestStickyCannotHoldATeam(t *testing.T) {
	// Longer than the team's C (a minute of its rate) takes to matter.
	r := mustRun(t, Config{Scenario: scenario(t, "team"), Strategy: Sticky, Duration: 3 * time.Minute, Seed: 13})
	team := r.Budgets[TeamKeys]
	if team.OverLimit <= 0 {
		t.Fatalf("sticky kept the team within C + rho*t (%+.1f%% of C); with the keys on different owners it cannot", 100*team.OverLimit)
	}
	t.Logf("the team's worst window: %+.1f%% of C over C + rho*t", 100*team.OverLimit)
}

// TestOutageFollowsFallbackPolicy: while the allocator is unreachable and
// no lease can still be valid, each leased spender does what its policy
// says: share admits at most its share (C/a burst plus rho/a per second,
// a the active spenders), closed admits nothing, open admits everything;
// after the outage the fleet admits from leases again and the debt it
// reported keeps the run within the long-run total.
func TestOutageFollowsFallbackPolicy(t *testing.T) {
	sc := scenario(t, "outage")
	for _, p := range []spender.FallbackPolicy{spender.FallbackShare, spender.FailClosed, spender.FailOpen} {
		t.Run(p.String(), func(t *testing.T) {
			t.Parallel()
			const n = 8
			// Three minutes, so that the run outlasts the repayment of what
			// fail open admits in fallback (reported as debt; refill repays
			// it once the shares granted before it was reported have been
			// renewed, within half a TTL).
			r := mustRun(t, Config{Scenario: sc, Strategy: Leased, Instances: n, Duration: 3 * time.Minute, Seed: 3, Fallback: p})
			var admitted, offered int64
			for i := range r.OutageAdmitted {
				admitted += r.OutageAdmitted[i]
				offered += r.OutageOffered[i]
			}
			switch p {
			case spender.FallbackShare:
				share := (float64(r.Capacity) + r.Rate*r.OutageWindow.Seconds()) / n
				for i, a := range r.OutageAdmitted {
					if float64(a) > share+1 {
						t.Errorf("instance %d admitted %d during the outage, above its share %.1f", i, a, share)
					}
				}
				if r.OutageAdmitted[0] == 0 || r.Fallback == 0 {
					t.Errorf("the hot instance admitted %d during the outage (%d fallback admissions), want its share", r.OutageAdmitted[0], r.Fallback)
				}
			case spender.FailClosed:
				if admitted != 0 || r.Fallback != 0 {
					t.Errorf("fail closed admitted %d during the outage (%d in fallback), want 0", admitted, r.Fallback)
				}
			case spender.FailOpen:
				if float64(admitted) < 0.99*float64(offered) {
					t.Errorf("fail open admitted %d of %d offered during the outage, want all", admitted, offered)
				}
			}
			// Recovery: in the last 20 s the spenders admit from leases
			// at least at the limit's rate again, and over the whole run
			// (fallback admissions reported as debt) the fleet stays within
			// the long-run total C + rho*(T + TTL).
			got, secs := 0.0, 0.0
			for _, pt := range r.Series {
				if pt.At >= r.Duration-20*time.Second {
					got += pt.Admitted
					secs++
				}
			}
			if rate := got / secs; rate < 0.95*r.Rate {
				t.Errorf("after the outage the fleet admits %.1f/s, want at least 95%% of the limit's %.1f/s", rate, r.Rate)
			}
			if total := float64(r.Capacity) + r.Rate*(r.Duration+r.TTL).Seconds(); r.AdmittedUnits > total {
				t.Errorf("admitted %.0f over the run, above the long-run total %.0f", r.AdmittedUnits, total)
			}
			t.Logf("outage window %v: admitted %d of %d offered, %d fallback admissions in all", r.OutageWindow, admitted, offered, r.Fallback)
		})
	}
}

// TestIsFallbackMatchesMetrics cross-checks the simulator's per-request
// view of fallback admissions against the spender's own counter.
func TestIsFallbackMatchesMetrics(t *testing.T) {
	r := mustRun(t, Config{Scenario: scenario(t, "outage"), Strategy: Leased, Duration: time.Minute, Seed: 5})
	if r.Fallback == 0 || float64(r.Fallback) != r.FallbackUnits {
		t.Fatalf("spender counted %d fallback admissions, the simulator %.0f; want equal and positive", r.Fallback, r.FallbackUnits)
	}
}

// TestSameSeedSameResult: a run is a function of its Config, also where
// each spender holds several keys (team: its maintenance scan walks them
// in an order that differs between Limiters) and where a client's
// requests follow what the strategy told it (client-load).
func TestSameSeedSameResult(t *testing.T) {
	for _, st := range Strategies() {
		t.Run("lossy/"+string(st), func(t *testing.T) {
			t.Parallel()
			sameSeedSameResult(t, "lossy", st, 20*time.Second)
		})
	}
	for _, st := range []Strategy{Leased, LeasedStrict} {
		t.Run("team/"+string(st), func(t *testing.T) {
			t.Parallel()
			sameSeedSameResult(t, "team", st, 20*time.Second)
		})
		t.Run("client-load/"+string(st), func(t *testing.T) {
			t.Parallel()
			sameSeedSameResult(t, "client-load", st, 10*time.Minute)
		})
	}
}

func sameSeedSameResult(t *testing.T, name string, st Strategy, d time.Duration) {
	cfg := Config{Scenario: scenario(t, name), Strategy: st, Duration: d, Seed: 9}
	a, b := mustRun(t, cfg), mustRun(t, cfg)
	if !reflect.DeepEqual(a, b) {
		t.Fatalf("two runs with seed 9 differ:\n%+v\n%+v", a, b)
	}
	cfg.Seed = 10
	if c := mustRun(t, cfg); c.Offered == a.Offered && c.Admitted == a.Admitted {
		t.Fatalf("seeds 9 and 10 gave the same traffic (%d offered, %d admitted)", a.Offered, a.Admitted)
	}
}

// BenchmarkMillionRequests simulates about 1,000,000 requests (2000 a second
// for 501 virtual seconds, twice a 60,000 RPM limit) across 16 leased
// spenders with Zipf-skewed traffic.
func BenchmarkMillionRequests(b *testing.B) {
	cfg := Config{Scenario: Scenarios()[1], Strategy: Leased, Instances: 16, Duration: 501 * time.Second,
		Limits: ration.Limits{RPM: 60_000}, Seed: 1}
	for b.Loop() {
		r, err := Run(cfg)
		if err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(float64(r.Offered), "requests/op")
		b.ReportMetric(r.AdmitFrac*100, "admit%")
	}
}

func ExampleRun() {
	r, err := Run(Config{Scenario: FixedSkew("one-hot", 1, 0, 0, 0), Strategy: Static, Instances: 4, Duration: 10 * time.Minute, Overload: 1, Seed: 1})
	if err != nil {
		panic(err)
	}
	fmt.Printf("static split, all traffic on one of 4 instances: %.2f of the limit in the long run\n", r.Steady)
	// Output: static split, all traffic on one of 4 instances: 0.25 of the limit in the long run
}

// countingSource counts the key entries of every call the allocator
// answers without an error: what a LeaseSource in front of the allocator
// sees of its per-key work.
type countingSource struct {
	spender.LeaseSource
	keys, calls int64
}

func (c *countingSource) Acquire(ctx context.Context, r *leasev1.AcquireRequest) (*leasev1.AcquireResponse, error) {
	resp, err := c.LeaseSource.Acquire(ctx, r)
	if err == nil {
		c.keys += int64(len(resp.GetKeys()))
		c.calls++
	}
	return resp, err
}

func (c *countingSource) ReserveAhead(ctx context.Context, r *leasev1.ReserveAheadRequest) (*leasev1.ReserveAheadResponse, error) {
	resp, err := c.LeaseSource.ReserveAhead(ctx, r)
	if err == nil {
		c.keys += int64(len(resp.GetKeys()))
		c.calls++
	}
	return resp, err
}

// TestKeyGrantsMatchACountingSource: the key-grants a run reports are the
// key entries a source in front of the allocator counts in its answers,
// with lost messages and replays (lossy), calls refused in an outage,
// several keys per call (team) and central's call per request; the rate
// counts those answered during the traffic, and the active pairs are the
// instances with traffic per refresh interval.
func TestKeyGrantsMatchACountingSource(t *testing.T) {
	for _, tc := range []struct {
		scenario string
		st       Strategy
		rpm      int64
	}{
		{"lossy", Leased, 0},
		{"outage", LeasedStrict, 0},
		{"team", Leased, 0},
		{"moving", Leased, 0},
		{"lossy", Central, 600},
	} {
		t.Run(tc.scenario+"/"+string(tc.st), func(t *testing.T) {
			t.Parallel()
			cs := &countingSource{}
			cfg := Config{Scenario: scenario(t, tc.scenario), Strategy: tc.st, Duration: 20 * time.Second, Seed: 5,
				wrapSource: func(src spender.LeaseSource) spender.LeaseSource { cs.LeaseSource = src; return cs }}
			if tc.rpm > 0 {
				cfg.Limits = ration.Limits{RPM: tc.rpm}
			}
			r := mustRun(t, cfg)
			if r.KeyGrants != cs.keys || cs.keys == 0 {
				t.Fatalf("the run counted %d key-grants, the source %d; want equal and positive", r.KeyGrants, cs.keys)
			}
			if cs.keys < cs.calls || tc.scenario == "team" && cs.keys == cs.calls {
				t.Errorf("%d keys in %d answered calls", cs.keys, cs.calls)
			}
			if during := r.KeyGrantsPerSec * r.Duration.Seconds(); during > float64(r.KeyGrants)+1e-6 || during < 0.5*float64(r.KeyGrants) {
				t.Errorf("%.0f key-grants during the traffic, of %d in the run", during, r.KeyGrants)
			}
			if r.Refresh != 2*time.Second || r.ActivePairs <= 0 || r.ActivePairs > float64(len(r.Budgets)*r.Instances) {
				t.Errorf("%.2f active pairs per %v refresh interval", r.ActivePairs, r.Refresh)
			}
			if math.Abs(r.KeyGrantsPerPair*r.ActivePairs-r.KeyGrantsPerSec) > 1e-9 {
				t.Errorf("%.4f key-grants/s per pair × %.2f pairs ≠ %.4f key-grants/s", r.KeyGrantsPerPair, r.ActivePairs, r.KeyGrantsPerSec)
			}
			t.Logf("%d key-grants in %d answered calls (%d attempts), %.2f/s, %.2f active pairs, %.3f/s per pair", r.KeyGrants, cs.calls, r.Calls, r.KeyGrantsPerSec, r.ActivePairs, r.KeyGrantsPerPair)
		})
	}
	t.Run("static", func(t *testing.T) {
		r := mustRun(t, Config{Scenario: scenario(t, "uniform"), Strategy: Static, Duration: 10 * time.Second, Seed: 5})
		// 200 requests a second over 8 instances: every instance has
		// traffic in every 2 s interval.
		if r.KeyGrants != 0 || r.KeyGrantsPerSec != 0 || r.ActivePairs != 8 {
			t.Errorf("static: %d key-grants (%.2f/s), %.2f active pairs; want none, none and 8", r.KeyGrants, r.KeyGrantsPerSec, r.ActivePairs)
		}
	})
}

// TestMovingMovesTheTraffic: in the moving scenario each 5 s period's
// busy quarter of the instances is offered about 90% of the requests, the
// busy quarter of one period is idle-ish in the next (the per-instance
// offered counts differ by period), and every instance is busy in turn.
func TestMovingMovesTheTraffic(t *testing.T) {
	sc := scenario(t, "moving")
	for _, n := range []int{8, 64} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			tr := newTraffic(Config{Scenario: sc, Limits: ration.Limits{RPM: 6000}, Overload: 2, Seed: 3}, 0)
			live := make([]int32, n)
			for i := range live {
				live[i] = int32(i)
			}
			k := n / 4
			period := int64(5 * time.Second / time.Microsecond)
			const draws = 20_000
			busyEver := make([]bool, n)
			var prev []int64
			for p := range int64(8) {
				counts := make([]int64, n)
				var r request
				for j := range int64(draws) {
					tr.fill(&r, p*period+j*period/draws, live)
					counts[r.origin]++
				}
				busy, first := int64(0), int(p)*k%n
				for j := range k {
					i := (first + j) % n
					busy += counts[i]
					busyEver[i] = true
					if prev != nil && counts[i] < 4*prev[i] {
						t.Errorf("period %d: busy instance %d offered %d, %d in the period before; want the traffic moved to it", p, i, counts[i], prev[i])
					}
				}
				if f := float64(busy) / draws; f < 0.88 || f > 0.92 {
					t.Errorf("period %d: the busy quarter from instance %d was offered %.3f of the requests, want about 0.9", p, first, f)
				}
				prev = counts
			}
			for i, b := range busyEver {
				if !b {
					t.Errorf("instance %d was never busy in 8 periods", i)
				}
			}
		})
	}
	// Over whole cycles every instance is offered the same on average.
	if sh := sc.Shares(8); math.Abs(sh[0]-0.125) > 1e-12 {
		t.Errorf("shares %v, want uniform", sh)
	}
}
