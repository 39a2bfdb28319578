package engine

import (
	"math"
	"slices"
	"time"

	"github.com/rationhq/ration"
	"github.com/rationhq/ration/spender"
)

// Result is what one run measured. Amounts are in the primary budget's
// binding dimension (Dim): requests, or tokens for the tokens scenarios.
// The primary budget is the one key, or, for a scenario that charges each
// request to several budgets, the one named by Primary (the team's, or
// output tokens'); Budgets has every budget's numbers.
type Result struct {
	Scenario  string
	Strategy  Strategy
	Instances int
	Overload  float64       // offered load over the binding limit's rate; 0: none but the client's (ClientAlone)
	Duration  time.Duration // traffic was offered for this long (virtual)
	Seed      uint64
	Primary   string // the primary budget's key
	Dim       spender.Dimension
	Capacity  int64   // C of the binding dimension
	Rate      float64 // rho of the binding dimension, per second
	TTL       time.Duration

	Offered  int64 // requests offered
	Admitted int64 // requests admitted

	// AdmittedUnits is what the admitted requests used in Dim (requests,
	// or actual tokens), Allowed is C + rho*Duration, and AdmitFrac their
	// ratio: the fraction of what the limit allows.
	AdmittedUnits float64
	Allowed       float64
	AdmitFrac     float64
	// IdealUnits is what one exact bucket holding the whole budget admits
	// from the same arrivals with no network (the reference), VsIdeal the
	// ratio AdmittedUnits/IdealUnits.
	IdealUnits float64
	VsIdeal    float64
	// Steady is the admitted rate over the second half of the run as a
	// fraction of rho: the long-run share once the initial burst is spent.
	Steady float64

	// OverLimit is the worst window's admitted net cost minus C + rho*t,
	// as a fraction of C, over every window length, both dimensions and
	// every budget, each against its own C and rho (<= 0: the bound held).
	// OverLease is the same against the lease bound C + rho*(t + TTL).
	OverLimit float64
	OverLease float64
	// OverLimitGranted and OverLeaseGranted are the same over the
	// admissions made from grants only, leaving out those made under the
	// fallback policy (which invariant 1 does not cover; they are reported
	// to the allocator as debt). FallbackUnits is what those used (of the
	// primary budget).
	OverLimitGranted float64
	OverLeaseGranted float64
	FallbackUnits    float64

	// Per-instance admission probability (admitted/offered, by the
	// instance the request arrived at), over instances offered anything.
	InstOffered  []int64
	InstAdmitted []int64
	Jain         float64 // Jain's fairness index of the probabilities, 1 = equal
	MinProb      float64
	MaxProb      float64
	// InstIdeal is what the ideal single bucket admitted of each
	// instance's arrivals, and IdealJain the index of those probabilities:
	// an exact limiter is not equal per instance where traffic moves (the
	// instance that is busy while the bucket is full admits more).
	InstIdeal []int64
	IdealJain float64

	Calls         int64   // allocator call attempts (lost ones included)
	CallsPerAdmit float64 // Calls / Admitted

	// KeyGrants is the allocator's per-key work: the key entries of every
	// Acquire (and ReserveAhead) it answered, one per key of each call,
	// whatever it granted, replays from its exactly-once record and
	// answers lost on the way back included, over the whole run (drain
	// too). KeyGrantsPerSec is those answered while traffic was offered,
	// per second of it.
	KeyGrants       int64
	KeyGrantsPerSec float64
	// ActivePairs is the mean number of active (key, gateway) pairs per
	// refresh interval (Refresh): a pair is active in an interval when
	// the gateway was offered a request charged to the key in it.
	// KeyGrantsPerPair is KeyGrantsPerSec / ActivePairs: at most
	// 1/Refresh when each active pair is granted at most once per
	// refresh interval.
	Refresh          time.Duration
	ActivePairs      float64
	KeyGrantsPerPair float64
	// PairIntervals counts the (pair, refresh interval) where the pair
	// was active, PairActivations those where it was not active in the
	// interval before (a pair becoming active), and
	// KeyGrantsPerActivation is the key-grants answered during the
	// traffic over PairActivations.
	PairIntervals          int64
	PairActivations        int64
	KeyGrantsPerActivation float64

	// SplitVsIdeal is, for the tokens scenario, what the best fixed split
	// of the budget's reservations over the instances admits as a
	// fraction of what one pool admits (TokensPool: a pool of C, or of
	// C + rho*TTL for Leased): the most a fleet admitting only from
	// reservations it holds can reach against the ideal. 0 elsewhere.
	SplitVsIdeal float64

	// The client contract. Refusals counts the refusals with a
	// Retry-After (every 429), each beside the ideal single bucket's exact
	// wait for the same request at the same instant (0 where the ideal
	// admitted it). RetryErrP50 and RetryErrP99 are percentiles of
	// Retry-After minus that wait (positive: late, the client waits
	// longer than it must; negative: early, it comes back before the
	// ideal would admit it). RetryLate is the share of refusals later
	// than the ideal's wait by more than LateSlack plus a LateSlackDiv-th
	// of it, RetryEarly the share earlier than it at all.
	Refusals    int64
	RetryErrP50 time.Duration
	RetryErrP99 time.Duration
	RetryLate   float64
	RetryEarly  float64
	// Retries counts the requests the scenario's client sent again
	// RetryAfterSeconds after a refusal, RetriesAdmitted those admitted
	// (Scenario.Client; 0 and 0 without a client). RetriesIdeal counts
	// those the ideal single bucket admitted (offered each at the same
	// instant, from its own state), RetriesEarly those sent before the
	// ideal's exact wait at the refusal they follow (the client was told
	// to come back too soon).
	Retries         int64
	RetriesAdmitted int64
	RetriesIdeal    int64
	RetriesEarly    int64
	// IdleChecks counts the times a gateway went a TTL without a request
	// (mid-run or after the traffic), and IdleHolding those at which it
	// still held budget: keys in its spender (ration_spender_keys_held,
	// IdleKeys), or an allocator holding that still counts with units
	// or a refill share (IdleShares) as the allocator's last answer to
	// the gateway stated it. IdleHeld is the most units of the primary
	// budget the allocator still counted for one idle gateway.
	IdleChecks  int64
	IdleHolding int64
	IdleKeys    int64
	IdleShares  int64
	IdleHeld    float64

	// Added latency: the time a request waited on a simulated allocator
	// call before its decision, over every offered request (most wait 0).
	WaitedFrac float64
	P50        time.Duration
	P99        time.Duration
	MaxWait    time.Duration

	Fallback    int64 // admissions under the fallback policy (leased spenders' metrics: one per budget charged)
	AllocErrors int64 // calls the allocator answered with an error (refused bodies)

	// Stranded is budget the allocator took out of the global bucket for
	// this fleet that no request used and no spender gave back: leases
	// that expired unspent, refunds that came back after their lease
	// expired. It is measured after a drain (TTL + horizon after the last
	// arrival, then Close). StrandedFrac is Stranded/Allowed. With refill
	// shares and several budgets it is unknown (StrandedUnknown; both 0):
	// the spenders count what their shares added per dimension, not per
	// budget.
	Stranded        float64
	StrandedFrac    float64
	StrandedUnknown bool

	ReservedTokens int64 // tokens reserved by admitted requests (prompt + max_tokens)
	UsedTokens     int64 // tokens they used

	// Outage, when the scenario has one: admissions (by deciding instance)
	// and offers (by arrival instance) between the instant no lease can
	// still be valid (outage start + TTL + slow-path deadline) and the end
	// of the outage, and that window's length.
	OutageAdmitted []int64
	OutageOffered  []int64
	OutageWindow   time.Duration

	Series []Point // one per SeriesStep of traffic

	// Budgets is every budget's own numbers, in the scenario's order
	// (one for a one-key scenario).
	Budgets []BudgetResult

	// Clusters is each cluster's numbers, for a scenario over several
	// allocator clusters (Scenario.Clusters); its headline numbers are
	// then the sums over every key, and Budgets has one per key.
	Clusters []ClusterResult
}

// BudgetResult is what a run measured for one budget, in its dimension:
// the primary budget's fields are also the Result's.
type BudgetResult struct {
	Name     string // the budget's key
	Limits   ration.Limits
	Dim      spender.Dimension
	Capacity int64   // C
	Rate     float64 // rho, per second

	OfferedUnits  float64 // what the offered requests would use
	AdmittedUnits float64 // what the admitted requests used
	Allowed       float64 // C + rho*Duration
	AdmitFrac     float64 // AdmittedUnits / Allowed
	IdealUnits    float64 // what the ideal admitted: one exact bucket per budget, every request charged to all of its budgets or none
	VsIdeal       float64 // AdmittedUnits / IdealUnits
	Steady        float64 // admitted rate over the second half, as a fraction of rho

	OverLimit        float64 // as Result's, for this budget alone
	OverLease        float64
	OverLimitGranted float64
	OverLeaseGranted float64
	FallbackUnits    float64 // admitted under the fallback policy

	Stranded        float64 // as Result's, for this budget alone
	StrandedFrac    float64
	StrandedUnknown bool
}

// Point is one time-series bucket, in the binding dimension.
type Point struct {
	At       time.Duration // bucket start
	Offered  float64       // offered demand: requests, or the tokens the offered requests would use
	Admitted float64
	Ideal    float64
}

// finishFairness computes the per-instance probabilities and Jain's index,
// the fleet's and the ideal's.
func (r *Result) finishFairness() {
	r.Jain, r.MinProb, r.MaxProb = jain(r.InstOffered, r.InstAdmitted)
	r.IdealJain, _, _ = jain(r.InstOffered, r.InstIdeal)
}

// jain is Jain's index of the admission probabilities admitted[i] /
// offered[i] over the instances offered anything, and their extremes.
func jain(offered, admitted []int64) (index, lo, hi float64) {
	var sum, sq float64
	n := 0
	lo, hi = math.Inf(1), 0
	for i, o := range offered {
		if o == 0 || i >= len(admitted) {
			continue
		}
		p := float64(admitted[i]) / float64(o)
		sum += p
		sq += p * p
		n++
		lo, hi = min(lo, p), max(hi, p)
	}
	switch {
	case n == 0:
		return 1, 0, hi
	case sq == 0:
		return 1, lo, hi // everyone rejected everything: equal, if useless
	}
	return sum * sum / (float64(n) * sq), lo, hi
}

// percentiles fills the latency fields from the waits of the requests that
// waited (µs) and the number offered.
func (r *Result) percentiles(waits []int64) {
	if r.Offered == 0 {
		return
	}
	r.WaitedFrac = float64(len(waits)) / float64(r.Offered)
	if len(waits) == 0 {
		return
	}
	slices.Sort(waits)
	zeros := r.Offered - int64(len(waits))
	at := func(q float64) time.Duration {
		rank := int64(math.Ceil(q*float64(r.Offered))) - 1 // nearest rank
		if rank < zeros {
			return 0
		}
		return time.Duration(waits[min(rank-zeros, int64(len(waits)-1))]) * time.Microsecond
	}
	r.P50, r.P99 = at(0.50), at(0.99)
	r.MaxWait = time.Duration(waits[len(waits)-1]) * time.Microsecond
}

// RetriedAdmitted is the share of the client's honoured retries that were
// admitted, and false when it sent none.
func (r *Result) RetriedAdmitted() (float64, bool) {
	if r.Retries == 0 {
		return 0, false
	}
	return float64(r.RetriesAdmitted) / float64(r.Retries), true
}

// RetriedIdeal is the share of the same retries the ideal single bucket
// admitted, and false when the client sent none.
func (r *Result) RetriedIdeal() (float64, bool) {
	if r.Retries == 0 {
		return 0, false
	}
	return float64(r.RetriesIdeal) / float64(r.Retries), true
}

// retryErrors fills the Retry-After percentiles from the per-refusal
// errors (µs; sorted here) and the late and early counts.
func (r *Result) retryErrors(errs []int64, late, early int64) {
	r.Refusals = int64(len(errs))
	if len(errs) == 0 {
		return
	}
	slices.Sort(errs)
	at := func(q float64) time.Duration {
		rank := max(0, int(math.Ceil(q*float64(len(errs))))-1) // nearest rank
		return time.Duration(errs[rank]) * time.Microsecond
	}
	r.RetryErrP50, r.RetryErrP99 = at(0.50), at(0.99)
	r.RetryLate, r.RetryEarly = float64(late)/float64(len(errs)), float64(early)/float64(len(errs))
}
