package report

import (
	"encoding/csv"
	"fmt"
	"io"
	"strconv"

	"github.com/rationhq/ration/sim/engine"
)

func f(v float64) string { return strconv.FormatFloat(v, 'g', 6, 64) }
func d(v int64) string   { return strconv.FormatInt(v, 10) }

// ResultsCSV writes one row per result with every measurement.
func ResultsCSV(w io.Writer, rs []*engine.Result) error {
	cw := csv.NewWriter(w)
	cw.Write([]string{"scenario", "strategy", "instances", "overload", "duration_s", "seed", "dimension", "capacity", "rate_per_s", "ttl_s",
		"offered", "admitted", "admitted_units", "allowed_units", "admit_frac", "ideal_units", "vs_ideal", "steady_frac",
		"over_limit_frac_of_c", "over_lease_frac_of_c", "over_limit_granted_frac_of_c", "over_lease_granted_frac_of_c",
		"jain", "min_prob", "max_prob", "calls", "calls_per_admit",
		"key_grants", "key_grants_per_s", "refresh_s", "active_pairs", "key_grants_per_s_per_pair", "waited_frac", "p50_ms", "p99_ms", "max_wait_ms",
		"fallback_admits", "fallback_units", "alloc_errors", "stranded_units", "stranded_frac", "reserved_tokens", "used_tokens",
		"pair_intervals", "pair_activations", "key_grants_per_activation", "split_vs_ideal",
		"refusals", "retry_err_p50_s", "retry_err_p99_s", "retry_late_frac", "retry_early_frac", "retries", "retries_admitted",
		"retries_ideal", "retries_early",
		"idle_checks", "idle_holding", "idle_keys", "idle_shares", "idle_held_units"})
	for _, r := range rs {
		cw.Write([]string{r.Scenario, string(r.Strategy), d(int64(r.Instances)), f(r.Overload), f(r.Duration.Seconds()), strconv.FormatUint(r.Seed, 10),
			r.Dim.String(), d(r.Capacity), f(r.Rate), f(r.TTL.Seconds()),
			d(r.Offered), d(r.Admitted), f(r.AdmittedUnits), f(r.Allowed), f(r.AdmitFrac), f(r.IdealUnits), f(r.VsIdeal), f(r.Steady),
			f(r.OverLimit), f(r.OverLease), f(r.OverLimitGranted), f(r.OverLeaseGranted),
			f(r.Jain), f(r.MinProb), f(r.MaxProb), d(r.Calls), f(r.CallsPerAdmit),
			d(r.KeyGrants), f(r.KeyGrantsPerSec), f(r.Refresh.Seconds()), f(r.ActivePairs), f(r.KeyGrantsPerPair), f(r.WaitedFrac),
			f(r.P50.Seconds() * 1e3), f(r.P99.Seconds() * 1e3), f(r.MaxWait.Seconds() * 1e3),
			d(r.Fallback), f(r.FallbackUnits), d(r.AllocErrors), known(r.StrandedUnknown, f(r.Stranded)), known(r.StrandedUnknown, f(r.StrandedFrac)), d(r.ReservedTokens), d(r.UsedTokens),
			d(r.PairIntervals), d(r.PairActivations), f(r.KeyGrantsPerActivation), f(r.SplitVsIdeal),
			d(r.Refusals), f(r.RetryErrP50.Seconds()), f(r.RetryErrP99.Seconds()), f(r.RetryLate), f(r.RetryEarly), d(r.Retries), d(r.RetriesAdmitted),
			d(r.RetriesIdeal), d(r.RetriesEarly),
			d(r.IdleChecks), d(r.IdleHolding), d(r.IdleKeys), d(r.IdleShares), f(r.IdleHeld)})
	}
	cw.Flush()
	return cw.Error()
}

// BudgetsCSV writes one row per budget of each result (one for a one-key
// scenario), in the budget's dimension; the primary budget's row repeats
// the result's own numbers.
func BudgetsCSV(w io.Writer, rs []*engine.Result) error {
	cw := csv.NewWriter(w)
	cw.Write([]string{"scenario", "strategy", "instances", "overload", "budget", "primary", "dimension", "rpm", "tpm", "capacity", "rate_per_s",
		"offered_units", "admitted_units", "allowed_units", "admit_frac", "ideal_units", "vs_ideal", "steady_frac",
		"over_limit_frac_of_c", "over_lease_frac_of_c", "over_limit_granted_frac_of_c", "over_lease_granted_frac_of_c",
		"fallback_units", "stranded_units", "stranded_frac"})
	for _, r := range rs {
		for _, b := range r.Budgets {
			cw.Write([]string{r.Scenario, string(r.Strategy), d(int64(r.Instances)), f(r.Overload), b.Name, strconv.FormatBool(b.Name == r.Primary), b.Dim.String(),
				d(b.Limits.RPM), d(b.Limits.TPM), d(b.Capacity), f(b.Rate),
				f(b.OfferedUnits), f(b.AdmittedUnits), f(b.Allowed), f(b.AdmitFrac), f(b.IdealUnits), f(b.VsIdeal), f(b.Steady),
				f(b.OverLimit), f(b.OverLease), f(b.OverLimitGranted), f(b.OverLeaseGranted),
				f(b.FallbackUnits), known(b.StrandedUnknown, f(b.Stranded)), known(b.StrandedUnknown, f(b.StrandedFrac))})
		}
	}
	cw.Flush()
	return cw.Error()
}

// InstancesCSV writes each instance's offered and admitted requests and
// admission probability, and the ideal single bucket's, per result.
func InstancesCSV(w io.Writer, rs []*engine.Result) error {
	cw := csv.NewWriter(w)
	cw.Write([]string{"scenario", "strategy", "instance", "offered", "admitted", "probability", "ideal", "ideal_probability"})
	for _, r := range rs {
		for i, o := range r.InstOffered {
			ideal := r.InstIdeal[i]
			p, pi := "", ""
			if o > 0 {
				p, pi = f(float64(r.InstAdmitted[i])/float64(o)), f(float64(ideal)/float64(o))
			}
			cw.Write([]string{r.Scenario, string(r.Strategy), d(int64(i)), d(o), d(r.InstAdmitted[i]), p, d(ideal), pi})
		}
	}
	cw.Flush()
	return cw.Error()
}

// SeriesCSV writes the time series, per result, in the binding dimension.
func SeriesCSV(w io.Writer, rs []*engine.Result) error {
	cw := csv.NewWriter(w)
	cw.Write([]string{"scenario", "strategy", "t_s", "offered", "admitted", "ideal"})
	for _, r := range rs {
		for _, p := range r.Series {
			cw.Write([]string{r.Scenario, string(r.Strategy), fmt.Sprint(p.At.Seconds()), f(p.Offered), f(p.Admitted), f(p.Ideal)})
		}
	}
	cw.Flush()
	return cw.Error()
}
