package report

import (
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/rationhq/ration/sim/engine"
)

// The targets the leased strategies are checked against, as read from
// the simulator's results. Check applies them to the leased and
// leased-strict rows of AccuracyScenarios and ClientScenarios: the
// accuracy targets (waited, calls/adm, grants/s, vs ideal, Jain) to the
// first, the client contract (retries, Retry-After, idle held) and the
// bound to both.
const (
	// MaxWaitedBelowLimit is the largest share of offered requests that
	// may wait for an allocator call when the offered load is below the
	// limit (at most 1% at 0.8×).
	MaxWaitedBelowLimit = 0.01
	// MaxWaitedOverLimit is the same at or above the limit (at most 5% at
	// 2× and 5×).
	MaxWaitedOverLimit = 0.05
	// CallsLoad is the offered load the calls-per-admission target applies
	// at (2×); MaxCallsPerAdmit has its thresholds.
	CallsLoad = 2.0
	// MaxGrantsPerPairInterval and MaxGrantsPerActivation bound the
	// key-grants the allocator answers during the traffic, independently
	// of the request rate: one per active (key, gateway) pair per refresh
	// interval (Result.Refresh: -refresh, default the lease horizon), and
	// one more each time a pair becomes active. A pair active for k
	// consecutive intervals may take k+1: its first grant, a renewal per
	// later interval, and the give-back when its demand stops.
	MaxGrantsPerPairInterval = 1.0
	MaxGrantsPerActivation   = 1.0
	// MinVsIdeal is the least a row may admit as a fraction of what the
	// ideal single bucket admitted from the same arrivals (99%),
	// MinVsIdealMoving the same for the scenarios that add and remove
	// instances or move one hot instance (98% for rotating and
	// autoscale). The tokens scenario is judged against the best fixed
	// split of its reservations instead (Result.SplitVsIdeal).
	MinVsIdeal       = 0.99
	MinVsIdealMoving = 0.98
	// MinJain is Jain's index of the instances' admission probabilities
	// a row reaches where every instance is offered traffic (0.95), unless
	// it is within JainOfIdeal of the ideal single bucket's own index on
	// the same arrivals: an exact limiter cannot be fairer than the
	// ideal, which is below 0.95 where traffic moves fast.
	MinJain     = 0.95
	JainOfIdeal = 0.01

	// MinRetriedAlone is the least share of the client's honoured retries
	// admitted when it is alone on its key with 1 or 8 gateways (95%),
	// MinRetriedLoaded the same beside other traffic at CallsLoad × the
	// limit with 8 or 64 gateways (90%): a client told to come back
	// ⌈Retry-After⌉ later is not refused again. Unless no retry was sent
	// before the ideal's exact wait and the share is within RetriedOfIdeal
	// of the ideal single bucket's own share of the same retries (each
	// offered to it at the same instant): under load another client's
	// request takes the refill first now and then, and the ideal itself
	// admits 71-98% of the retries in half an hour of client-load at 2×
	// (seeds 1-10), which no exact limiter can beat.
	MinRetriedAlone  = 0.95
	MinRetriedLoaded = 0.90
	RetriedOfIdeal   = 0.01
	// MaxLate is the largest share of refusals whose Retry-After is later
	// than the ideal single bucket's exact wait by more than
	// engine.LateSlack plus a tenth (half: at the median, Retry-After is
	// within 1 s + 10% of the ideal's wait).
	MaxLate = 0.5
)

// MaxCallsPerAdmit is the most allocator calls per admitted request at
// CallsLoad, by fleet size (0.03 with 8 gateways, 0.2 with 64). Other
// fleet sizes have no target.
var MaxCallsPerAdmit = map[int]float64{8: 0.03, 64: 0.2}

// RetriedFleets are the fleet sizes the retries target applies at: for a
// client alone (client, client-day) and for one beside other traffic at
// CallsLoad (client-load).
var RetriedFleets = map[string][]int{"client": {1, 8}, "client-day": {1, 8}, "client-load": {8, 64}}

// AccuracyScenarios are the scenarios the accuracy targets are stated
// for. The multi-budget scenarios (team, tokens-io) are not checked.
var AccuracyScenarios = []string{"uniform", "zipf", "one", "rotating", "bursts", "moving", "autoscale", "outage", "lossy", "tokens"}

// ClientScenarios are the client contract's own scenarios: a client that
// honours Retry-After on a small key and on a per-day key.
var ClientScenarios = []string{"client", "client-load", "client-day"}

// minVsIdealFor is a scenario's vs-ideal threshold.
func minVsIdealFor(scenario string) float64 {
	if scenario == "rotating" || scenario == "autoscale" {
		return MinVsIdealMoving
	}
	return MinVsIdeal
}

// Cell is one target's verdict on one row.
type Cell struct {
	Applies bool   // the target is stated for this row
	Pass    bool   // it holds (meaningful when Applies)
	Text    string // the measured value, and the threshold when missed
}

func (c Cell) String() string {
	switch {
	case !c.Applies:
		return "-"
	case c.Pass:
		return "PASS " + c.Text
	}
	return "MISS " + c.Text
}

// Target is one of the targets.
type Target struct {
	Name string
	Eval func(r *engine.Result) Cell
}

// Targets returns the targets in the order Check reports them.
func Targets() []Target {
	return []Target{
		{"waited", accuracy(checkWaited)},
		{"calls/adm", accuracy(checkCalls)},
		{"grants/s", accuracy(checkGrants)},
		{"vs ideal", accuracy(checkVsIdeal)},
		{"Jain", accuracy(checkJain)},
		{"bound", checkBound},
		{"retries", checkRetries},
		{"Retry-After", checkRetryAfter},
		{"idle held", checkIdle},
	}
}

// accuracy states an accuracy target for AccuracyScenarios only.
func accuracy(eval func(r *engine.Result) Cell) func(r *engine.Result) Cell {
	return func(r *engine.Result) Cell {
		if !slices.Contains(AccuracyScenarios, r.Scenario) {
			return Cell{}
		}
		return eval(r)
	}
}

func checkWaited(r *engine.Result) Cell {
	limit := MaxWaitedOverLimit
	if r.Overload < 1 {
		limit = MaxWaitedBelowLimit
	}
	return atMost(r.WaitedFrac, limit, pct2)
}

func checkCalls(r *engine.Result) Cell {
	limit, ok := MaxCallsPerAdmit[r.Instances]
	if !ok || r.Overload != CallsLoad {
		return Cell{}
	}
	return atMost(r.CallsPerAdmit, limit, func(v float64) string { return fmt.Sprintf("%.4f", v) })
}

// checkGrants: key-grants per second against the active pairs per
// refresh interval plus the pairs' activations, both per second of
// traffic.
func checkGrants(r *engine.Result) Cell {
	T := r.Duration.Seconds()
	if r.PairIntervals == 0 || T <= 0 {
		return Cell{}
	}
	bound := (MaxGrantsPerPairInterval*float64(r.PairIntervals) + MaxGrantsPerActivation*float64(r.PairActivations)) / T
	c := atMost(r.KeyGrantsPerSec, bound, func(v float64) string { return fmt.Sprintf("%.2f/s", v) })
	if c.Pass {
		c.Text += fmt.Sprintf(" ≤ %.2f/s", bound)
	}
	c.Text += fmt.Sprintf(" (%.2f per activation)", r.KeyGrantsPerActivation)
	return c
}

// checkVsIdeal: admitted against the ideal single bucket's admissions;
// for tokens, against the best fixed split of the reservations, with
// the calls per admission that cost.
func checkVsIdeal(r *engine.Result) Cell {
	if r.SplitVsIdeal > 0 {
		c := atLeast(r.VsIdeal, r.SplitVsIdeal, pct2)
		c.Text += fmt.Sprintf(" (best fixed split %s; %.4f calls/adm)", pct2(r.SplitVsIdeal), r.CallsPerAdmit)
		return c
	}
	return atLeast(r.VsIdeal, minVsIdealFor(r.Scenario), pct2)
}

func checkJain(r *engine.Result) Cell {
	if len(r.InstOffered) == 0 || slices.Contains(r.InstOffered, 0) {
		return Cell{} // some instance has no demand
	}
	c := atLeast(r.Jain, min(MinJain, r.IdealJain-JainOfIdeal), func(v float64) string { return fmt.Sprintf("%.3f", v) })
	c.Text += fmt.Sprintf(" (ideal %.3f)", r.IdealJain)
	return c
}

// checkBound: in every budget, admissions from grants stay within the
// strategy's bound (C + ρ(t+TTL) for leased, C + ρt for leased-strict)
// and all admissions within it plus what was admitted under the fallback
// policy (reported to the allocator as debt), as TestBoundsHold checks.
func checkBound(r *engine.Result) Cell {
	if len(r.Budgets) == 0 {
		return Cell{}
	}
	c := Cell{Applies: true, Pass: true}
	worst := 0.0
	for i, b := range r.Budgets {
		granted, all := b.OverLimitGranted, b.OverLimit
		if r.Strategy == engine.Leased {
			granted, all = b.OverLeaseGranted, b.OverLease
		}
		if i == 0 || granted > worst {
			worst = granted
		}
		debt := 0.0
		if b.Capacity > 0 {
			debt = b.FallbackUnits / float64(b.Capacity)
		}
		if granted > 0 {
			c.Pass = false
		}
		if all > debt {
			c.Pass = false
			c.Text = fmt.Sprintf("%s: all %s > fallback %.1f%%C; ", b.Name, over(all), 100*debt)
		}
	}
	c.Text += "granted " + over(worst)
	return c
}

// checkRetries: the share of the client's honoured retries admitted, where
// RetriedFleets states it: at least its target, or, when none was sent
// early, at least the ideal's share of the same retries less
// RetriedOfIdeal.
func checkRetries(r *engine.Result) Cell {
	limit := MinRetriedAlone
	if r.Scenario == "client-load" {
		if r.Overload != CallsLoad {
			return Cell{}
		}
		limit = MinRetriedLoaded
	}
	if !slices.Contains(RetriedFleets[r.Scenario], r.Instances) {
		return Cell{}
	}
	share, ok := r.RetriedAdmitted()
	if !ok {
		return Cell{Applies: true, Text: "no retry"}
	}
	ideal, _ := r.RetriedIdeal()
	if r.RetriesEarly == 0 {
		limit = min(limit, ideal-RetriedOfIdeal)
	}
	c := atLeast(share, limit, pct2)
	c.Text += fmt.Sprintf(" of %d (ideal %s, %d early)", r.Retries, pct2(ideal), r.RetriesEarly)
	return c
}

// checkRetryAfter: at the median, Retry-After is within engine.LateSlack
// plus a tenth of the ideal's exact wait.
func checkRetryAfter(r *engine.Result) Cell {
	if r.Refusals == 0 {
		return Cell{}
	}
	c := atMost(r.RetryLate, MaxLate, func(v float64) string { return pct2(v) + " late" })
	c.Text += " (p50 " + signed(r.RetryErrP50) + ")"
	return c
}

// checkIdle: a gateway that has gone a TTL without a request holds
// nothing, in its spender or at the allocator.
func checkIdle(r *engine.Result) Cell {
	if r.IdleChecks == 0 {
		return Cell{}
	}
	if r.IdleHolding == 0 {
		return Cell{Applies: true, Pass: true, Text: fmt.Sprintf("0 of %d", r.IdleChecks)}
	}
	return Cell{Applies: true, Text: fmt.Sprintf("%d of %d held (%d with keys, %d with shares, up to %.0f units) > 0",
		r.IdleHolding, r.IdleChecks, r.IdleKeys, r.IdleShares, r.IdleHeld)}
}

// pct2 is a fraction as a percentage to two decimals: enough to tell a
// value from a threshold it misses.
func pct2(f float64) string { return fmt.Sprintf("%.2f%%", 100*f) }

func atMost(v, limit float64, show func(float64) string) Cell {
	if v <= limit {
		return Cell{Applies: true, Pass: true, Text: show(v)}
	}
	return Cell{Applies: true, Text: show(v) + " > " + show(limit)}
}

func atLeast(v, limit float64, show func(float64) string) Cell {
	if v >= limit {
		return Cell{Applies: true, Pass: true, Text: show(v)}
	}
	return Cell{Applies: true, Text: show(v) + " < " + show(limit)}
}

// Verdict is every target's verdict on one result.
type Verdict struct {
	Result *engine.Result
	Cells  []Cell // one per Targets(), in order
}

// Missed names the targets the row misses.
func (v Verdict) Missed() []string {
	var ms []string
	for i, t := range Targets() {
		if c := v.Cells[i]; c.Applies && !c.Pass {
			ms = append(ms, t.Name)
		}
	}
	return ms
}

// Checked reports whether targets are stated for r: a leased or
// leased-strict run of one of AccuracyScenarios or ClientScenarios.
func Checked(r *engine.Result) bool {
	return (r.Strategy == engine.Leased || r.Strategy == engine.LeasedStrict) &&
		(slices.Contains(AccuracyScenarios, r.Scenario) || slices.Contains(ClientScenarios, r.Scenario))
}

// Check evaluates the targets on every checked result, in order.
func Check(rs []*engine.Result) []Verdict {
	var vs []Verdict
	for _, r := range rs {
		if !Checked(r) {
			continue
		}
		v := Verdict{Result: r}
		for _, t := range Targets() {
			v.Cells = append(v.Cells, t.Eval(r))
		}
		vs = append(vs, v)
	}
	return vs
}

// CheckTable writes one row per verdict (PASS or MISS per target, "-"
// where a target is not stated for the row) and a line per target
// counting the rows that miss it, and returns the number of rows that
// miss any.
func CheckTable(w io.Writer, vs []Verdict, markdown bool) (missed int, err error) {
	ts := Targets()
	ids := runColumns(func(v Verdict) *engine.Result { return v.Result })
	var heads []string
	for _, c := range ids {
		heads = append(heads, c.head)
	}
	for _, t := range ts {
		heads = append(heads, t.Name)
	}
	heads = append(heads, "verdict")
	perTarget := make([]int, len(ts))
	var rows [][]string
	for _, v := range vs {
		var row []string
		for _, c := range ids {
			row = append(row, c.cell(v))
		}
		for i, c := range v.Cells {
			row = append(row, c.String())
			if c.Applies && !c.Pass {
				perTarget[i]++
			}
		}
		verdict := "PASS"
		if ms := v.Missed(); len(ms) > 0 {
			verdict = "MISS " + strings.Join(ms, ", ")
			missed++
		}
		rows = append(rows, append(row, verdict))
	}
	if err := writeCells(w, heads, rows, markdown); err != nil {
		return missed, err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\ncheck: %d of %d rows miss a target", missed, len(vs))
	for i, t := range ts {
		fmt.Fprintf(&b, "; %s %d", t.Name, perTarget[i])
	}
	b.WriteString("\n")
	_, err = io.WriteString(w, b.String())
	return missed, err
}
