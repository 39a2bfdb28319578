package engine

import (
	"fmt"
	"time"

	"github.com/rationhq/ration/spender"
)

// Clusters spreads a scenario's keys over several allocator clusters, as
// a gateway's spender.Router does: each key goes to the cluster
// spender.Route names, and each cluster is an independent allocator that
// every gateway reaches through a leased Limiter of its own for that
// cluster.
//
// Keys API keys, key-00, key-01, ..., each with limits Config.Limits/Keys
// (at least 1 per limited dimension), share the offered load Zipf-wise
// (exponent KeyZipfS): key k offers Overload × Keys × w_k times its own
// rate, so the keys together offer Overload × Config.Limits. Key k's
// requests arrive on the instances with Zipf (s = 1.1) shares ranked from
// instance k mod N, so each gateway is hot for a few keys.
//
// The cluster named Lost is unreachable from the scenario's OutageFrom to
// OutageTo; the others never are.
//
// A run simulates each key on its own, with the scenario's strategy and
// its own seed (from Config.Seed and the key's index), and adds the runs
// up (Result.Clusters has each cluster's sums). That is exact for the
// allocator's side, where clusters share nothing and keys interact only
// through the calls that carry them, and for every admission decision,
// which is per key; what it leaves out is the batching of a cluster's
// keys into one call of a gateway's Limiter, so the calls (not the
// key-grants) are those of one call per key.
type Clusters struct {
	Names    []string // the clusters' names, as the gateways' Routers have them
	Keys     int      // API keys; default 60
	KeyZipfS float64  // Zipf exponent of the keys' shares of the load; default 1
	Lost     string   // the cluster lost from OutageFrom to OutageTo; "": none
}

// ClusterResult is one cluster's part of a run over several clusters, in
// requests (or tokens, for a tokens scenario), summed over its keys.
type ClusterResult struct {
	Name string
	Lost bool     // unreachable from the scenario's OutageFrom to OutageTo
	Keys []string // routed here, in key order

	OfferedUnits  float64
	AdmittedUnits float64
	IdealUnits    float64 // what one exact bucket per key admits from the same arrivals
	VsIdeal       float64 // AdmittedUnits / IdealUnits
	// LossAdmitted and LossIdeal are what the cluster's keys admitted,
	// and their ideal buckets, from OutageFrom to OutageTo of the run (the
	// lost cluster's loss: a cluster that was not lost shows its own keys
	// over the same time), VsIdealLoss their ratio.
	LossAdmitted, LossIdeal, VsIdealLoss float64

	Calls           int64   // allocator call attempts (one call per key: see Clusters)
	KeyGrantsPerSec float64 // key entries this cluster's allocator answered per second of traffic
	Fallback        int64   // admissions under the fallback policy
	// The worst of the cluster's keys' worst windows, as BudgetResult's.
	OverLimit, OverLease, OverLimitGranted, OverLeaseGranted float64
}

// clusterKey is one key of a run over several clusters.
type clusterKey struct {
	name    string
	cluster int
	weight  float64 // its share of the offered load
}

// keys returns the keys of a run of cl, each routed to its cluster.
func (cl *Clusters) keys() []clusterKey {
	n := cl.Keys
	if n <= 0 {
		n = 60
	}
	s := cl.KeyZipfS
	if s <= 0 {
		s = 1
	}
	w := Scenario{Skew: Zipf, ZipfS: s}.Shares(n)
	ks := make([]clusterKey, n)
	for k := range ks {
		name := fmt.Sprintf("key-%02d", k)
		ks[k] = clusterKey{name: name, cluster: spender.Route(cl.Names, name), weight: w[k]}
	}
	return ks
}

// runClusters runs cfg's scenario over its clusters (cfg has its
// defaults) and adds the keys' runs up into one Result.
func runClusters(cfg Config) (*Result, error) {
	cl := cfg.Scenario.Clusters
	if len(cl.Names) == 0 {
		return nil, fmt.Errorf("engine: scenario %s has no clusters", cfg.Scenario.Name)
	}
	lost := -1
	for i, n := range cl.Names {
		if n == cl.Lost {
			lost = i
		}
	}
	if cl.Lost != "" && lost < 0 {
		return nil, fmt.Errorf("engine: scenario %s loses cluster %q, which it does not have", cfg.Scenario.Name, cl.Lost)
	}
	ks := cl.keys()
	lim := share(cfg.Limits, int64(len(ks)))
	n := cfg.Instances
	out := &Result{Scenario: cfg.Scenario.Name, Strategy: cfg.Strategy, Instances: n, Overload: cfg.Overload,
		Duration: cfg.Duration, Seed: cfg.Seed, TTL: cfg.TTL, Primary: "all keys", Dim: cfg.Scenario.Dim(),
		InstOffered: make([]int64, n), InstAdmitted: make([]int64, n), InstIdeal: make([]int64, n)}
	out.Clusters = make([]ClusterResult, len(cl.Names))
	for i, name := range cl.Names {
		out.Clusters[i] = ClusterResult{Name: name, Lost: i == lost}
	}
	var waits, errs []int64
	var late, early int64
	var steady, pairs float64
	zipf := Scenario{Skew: Zipf}.Shares(n)
	for k, key := range ks {
		sub := cfg
		sub.Limits = lim
		sub.Overload = cfg.Overload * float64(len(ks)) * key.weight
		sub.Seed = mix(cfg.Seed + uint64(k+1))
		sub.Scenario = Scenario{Name: cfg.Scenario.Name, Skew: Fixed, Weights: make([]float64, n), Tokens: cfg.Scenario.Tokens,
			Loss: cfg.Scenario.Loss, Jitter: cfg.Scenario.Jitter}
		for i, w := range zipf {
			sub.Scenario.Weights[(i+k)%n] = w
		}
		if key.cluster == lost {
			sub.Scenario.OutageFrom, sub.Scenario.OutageTo = cfg.Scenario.OutageFrom, cfg.Scenario.OutageTo
		}
		s, err := newSim(sub.withDefaults())
		if err != nil {
			return nil, err
		}
		s.loop()
		r := s.result()
		waits = append(waits, s.col.waits...)
		errs = append(errs, s.col.errs...)
		late, early = late+s.col.late, early+s.col.early
		b := r.Budgets[0]
		b.Name = key.name
		out.Budgets = append(out.Budgets, b)
		addKey(out, r, &out.Clusters[key.cluster], key.name, cfg)
		steady += r.Steady * r.Rate
		pairs += r.ActivePairs
	}
	out.Steady = steady / out.Rate
	out.ActivePairs = pairs
	out.retryErrors(errs, late, early)
	finishClusters(out, waits)
	return out, nil
}

// addKey adds one key's run r to the run's sums and to its cluster's c.
func addKey(out *Result, r *Result, c *ClusterResult, key string, cfg Config) {
	out.Offered += r.Offered
	out.Admitted += r.Admitted
	out.Capacity += r.Capacity
	out.Rate += r.Rate
	out.AdmittedUnits += r.AdmittedUnits
	out.Allowed += r.Allowed
	out.IdealUnits += r.IdealUnits
	out.FallbackUnits += r.FallbackUnits
	out.Calls += r.Calls
	out.KeyGrants += r.KeyGrants
	out.KeyGrantsPerSec += r.KeyGrantsPerSec
	out.Fallback += r.Fallback
	out.AllocErrors += r.AllocErrors
	out.Stranded += r.Stranded
	out.StrandedUnknown = out.StrandedUnknown || r.StrandedUnknown
	out.ReservedTokens += r.ReservedTokens
	out.UsedTokens += r.UsedTokens
	out.PairIntervals += r.PairIntervals
	out.PairActivations += r.PairActivations
	out.Retries += r.Retries
	out.RetriesAdmitted += r.RetriesAdmitted
	out.IdleChecks += r.IdleChecks
	out.IdleHolding += r.IdleHolding
	out.IdleKeys += r.IdleKeys
	out.IdleShares += r.IdleShares
	out.IdleHeld = max(out.IdleHeld, r.IdleHeld) // in each key's units: the worst key's
	for i := range r.InstOffered {
		out.InstOffered[i] += r.InstOffered[i]
		out.InstAdmitted[i] += r.InstAdmitted[i]
		out.InstIdeal[i] += r.InstIdeal[i]
	}
	if r.OutageWindow > 0 {
		if out.OutageAdmitted == nil {
			out.OutageAdmitted, out.OutageOffered = make([]int64, len(r.OutageAdmitted)), make([]int64, len(r.OutageOffered))
		}
		for i := range r.OutageAdmitted {
			out.OutageAdmitted[i] += r.OutageAdmitted[i]
			out.OutageOffered[i] += r.OutageOffered[i]
		}
		out.OutageWindow = r.OutageWindow
	}
	if out.Series == nil {
		out.Series = make([]Point, len(r.Series))
	}
	from, to := cfg.Scenario.outage(cfg.Duration)
	for i, p := range r.Series {
		out.Series[i].At = p.At
		out.Series[i].Offered += p.Offered
		out.Series[i].Admitted += p.Admitted
		out.Series[i].Ideal += p.Ideal
		if at := int64(p.At / time.Microsecond); at >= from && at < to {
			c.LossAdmitted += p.Admitted
			c.LossIdeal += p.Ideal
		}
	}
	b := &r.Budgets[0]
	c.Keys = append(c.Keys, key)
	c.OfferedUnits += b.OfferedUnits
	c.AdmittedUnits += b.AdmittedUnits
	c.IdealUnits += b.IdealUnits
	c.Calls += r.Calls
	c.KeyGrantsPerSec += r.KeyGrantsPerSec
	c.Fallback += r.Fallback
	if len(c.Keys) == 1 {
		c.OverLimit, c.OverLease, c.OverLimitGranted, c.OverLeaseGranted = b.OverLimit, b.OverLease, b.OverLimitGranted, b.OverLeaseGranted
	}
	c.OverLimit, c.OverLease = max(c.OverLimit, b.OverLimit), max(c.OverLease, b.OverLease)
	c.OverLimitGranted, c.OverLeaseGranted = max(c.OverLimitGranted, b.OverLimitGranted), max(c.OverLeaseGranted, b.OverLeaseGranted)
}

// finishClusters computes the run's ratios once every key is added.
func finishClusters(out *Result, waits []int64) {
	ratio := func(a, b float64) float64 {
		if b == 0 {
			return 0
		}
		return a / b
	}
	out.AdmitFrac = ratio(out.AdmittedUnits, out.Allowed)
	out.VsIdeal = ratio(out.AdmittedUnits, out.IdealUnits)
	out.StrandedFrac = ratio(out.Stranded, out.Allowed)
	out.CallsPerAdmit = ratio(float64(out.Calls), float64(out.Admitted))
	out.KeyGrantsPerPair = ratio(out.KeyGrantsPerSec, out.ActivePairs)
	out.KeyGrantsPerActivation = ratio(out.KeyGrantsPerSec*out.Duration.Seconds(), float64(out.PairActivations))
	if out.StrandedUnknown {
		out.Stranded, out.StrandedFrac = 0, 0
	}
	out.OverLimit, out.OverLease, out.OverLimitGranted, out.OverLeaseGranted = -1, -1, -1, -1
	for i, b := range out.Budgets {
		if i == 0 {
			out.OverLimit, out.OverLease, out.OverLimitGranted, out.OverLeaseGranted = b.OverLimit, b.OverLease, b.OverLimitGranted, b.OverLeaseGranted
		}
		out.OverLimit, out.OverLease = max(out.OverLimit, b.OverLimit), max(out.OverLease, b.OverLease)
		out.OverLimitGranted, out.OverLeaseGranted = max(out.OverLimitGranted, b.OverLimitGranted), max(out.OverLeaseGranted, b.OverLeaseGranted)
	}
	for i := range out.Clusters {
		c := &out.Clusters[i]
		c.VsIdeal = ratio(c.AdmittedUnits, c.IdealUnits)
		c.VsIdealLoss = ratio(c.LossAdmitted, c.LossIdeal)
	}
	out.finishFairness()
	out.percentiles(waits)
}
