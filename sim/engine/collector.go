package engine

import (
	"time"

	"github.com/rationhq/ration"
	leasev1 "github.com/rationhq/ration/proto/ration/lease/v1"
)

// collector accumulates a run's measurements as events happen.
type collector struct {
	tokens bool // the binding dimension is tokens

	offered, admitted int64
	admittedUnits     int64 // binding dimension, actual usage
	idealUnits        int64
	secondHalf        int64 // admitted units arriving in the second half of the run
	half              int64 // virtual µs where the second half starts
	reservedTok       int64
	usedTok           int64
	instOffered       []int64
	instAdmitted      []int64
	outageAdmitted    []int64
	outageOffered     []int64
	outFrom, outTo    int64  // window for outageAdmitted
	req, tok          window // every admission
	reqG, tokG        window // admissions from grants only (fallback left out)
	reqOn, tokOn      bool
	fbUnits           int64 // binding-dimension units admitted under fallback
	calls             int64
	allocErrors       int64
	granted, returned int64 // binding dimension, as applied by the allocator
	debt              int64
	waits             []int64
	series            []Point
	cur               Point
	fallback          int64
}

func (c *collector) init(s *sim) {
	n := s.cfg.Instances
	c.tokens = s.cfg.Scenario.Tokens
	c.instOffered, c.instAdmitted = make([]int64, n), make([]int64, n)
	c.outageAdmitted, c.outageOffered = make([]int64, n), make([]int64, n)
	c.half = s.end / 2
	lim := s.cfg.Limits
	c.req, c.reqG, c.reqOn = window{rate: lim.RPM}, window{rate: lim.RPM}, lim.RPM > 0
	c.tok, c.tokG, c.tokOn = window{rate: lim.TPM}, window{rate: lim.TPM}, lim.TPM > 0
	if s.outTo > s.outFrom {
		c.outFrom = s.outFrom + int64((s.cfg.TTL+s.cfg.SlowDeadline)/time.Microsecond)
		c.outTo = s.outTo
	}
}

// units is a cost in the binding dimension.
func (c *collector) units(x ration.Amount) int64 {
	if c.tokens {
		return x.Tokens
	}
	return x.Requests
}

func (c *collector) onOffer(s *sim, r *request) {
	c.offered++
	c.instOffered[r.origin]++
	if s.now >= c.outFrom && s.now < c.outTo {
		c.outageOffered[r.origin]++
	}
	c.cur.Offered += float64(c.units(r.actual))
}

func (c *collector) onIdeal(s *sim, r *request) {
	c.idealUnits += c.units(r.actual)
	c.cur.Ideal += float64(c.units(r.actual))
}

// admitted counts an admission: the reserved cost enters the windows now
// (net of the refund at settlement), the actual usage the totals.
func (c *collector) onAdmit(s *sim, r *request) {
	c.admitted++
	c.instAdmitted[r.origin]++
	u := c.units(r.actual)
	c.admittedUnits += u
	c.cur.Admitted += float64(u)
	if r.at >= c.half {
		c.secondHalf += u
	}
	if s.now >= c.outFrom && s.now < c.outTo {
		c.outageAdmitted[r.inst]++
	}
	c.reservedTok += r.cost.Tokens
	c.usedTok += r.actual.Tokens
	r.fallback = isFallback(r.res)
	if r.fallback {
		c.fbUnits += u
	}
	c.charge(s.now, r, r.cost.Requests, r.cost.Tokens)
	if w := s.now - r.at; w > 0 {
		c.waits = append(c.waits, w)
	}
}

func (c *collector) onReject(s *sim, r *request) {
	if w := s.now - r.at; w > 0 {
		c.waits = append(c.waits, w)
	}
}

// settled applies the settlement's adjustment (refund or overrun).
func (c *collector) onSettle(s *sim, r *request) {
	c.charge(s.now, r, r.actual.Requests-r.cost.Requests, r.actual.Tokens-r.cost.Tokens)
}

// charge adds a net charge of r's to the windows.
func (c *collector) charge(t int64, r *request, req, tok int64) {
	if c.reqOn {
		c.req.add(t, req)
		if !r.fallback {
			c.reqG.add(t, req)
		}
	}
	if c.tokOn {
		c.tok.add(t, tok)
		if !r.fallback {
			c.tokG.add(t, tok)
		}
	}
}

// applied records what the allocator did with one call (each sequence once).
func (c *collector) onApplied(s *sim, req *leasev1.AcquireRequest, resp *leasev1.AcquireResponse) {
	for i, k := range req.GetKeys() {
		g := resp.GetKeys()[i]
		c.debt += c.amount(k.GetDebt())
		c.granted += c.amount(g.GetGranted())
		c.returned += c.amount(g.GetReturned())
	}
}

func (c *collector) amount(a *leasev1.Amount) int64 {
	if c.tokens {
		return a.GetTokens()
	}
	return a.GetRequests()
}

// sample closes the current time-series bucket.
func (c *collector) sample(s *sim) {
	c.cur.At = time.Duration(s.now)*time.Microsecond - s.cfg.SeriesStep
	c.series = append(c.series, c.cur)
	c.cur = Point{}
}

// result turns the run's measurements into a Result.
func (s *sim) result() *Result {
	c := &s.col
	cfg := s.cfg
	lim := cfg.Limits
	r := &Result{
		Scenario: cfg.Scenario.Name, Strategy: cfg.Strategy, Instances: cfg.Instances,
		Duration: cfg.Duration, Seed: cfg.Seed, Dim: cfg.Scenario.Dim(), TTL: cfg.TTL,
		Offered: c.offered, Admitted: c.admitted,
		AdmittedUnits: float64(c.admittedUnits), IdealUnits: float64(c.idealUnits),
		InstOffered: c.instOffered, InstAdmitted: c.instAdmitted,
		Calls: c.calls, Fallback: c.fallback,
		ReservedTokens: c.reservedTok, UsedTokens: c.usedTok,
		Series: c.series,
	}
	capOf := func(rate, burst int64) int64 {
		if burst > 0 {
			return burst
		}
		return rate
	}
	rateMin := lim.RPM
	r.Capacity = capOf(lim.RPM, lim.BurstRequests)
	if cfg.Scenario.Tokens {
		rateMin, r.Capacity = lim.TPM, capOf(lim.TPM, lim.BurstTokens)
	}
	r.Rate = float64(rateMin) / 60
	T := cfg.Duration.Seconds()
	r.Allowed = float64(r.Capacity) + r.Rate*T
	r.AdmitFrac = r.AdmittedUnits / r.Allowed
	if r.IdealUnits > 0 {
		r.VsIdeal = r.AdmittedUnits / r.IdealUnits
	}
	r.Steady = float64(c.secondHalf) / (r.Rate * (T - float64(c.half)/1e6))
	over := func(w *window, rate, burst int64) (limit, lease float64) {
		C := float64(capOf(rate, burst))
		ex := w.maxExcess()
		return (ex - C) / C, (ex - C - float64(rate)*cfg.TTL.Minutes()) / C
	}
	r.OverLimit, r.OverLease, r.OverLimitGranted, r.OverLeaseGranted = -1, -1, -1, -1
	if c.reqOn {
		r.OverLimit, r.OverLease = over(&c.req, lim.RPM, lim.BurstRequests)
		r.OverLimitGranted, r.OverLeaseGranted = over(&c.reqG, lim.RPM, lim.BurstRequests)
	}
	if c.tokOn {
		a, b := over(&c.tok, lim.TPM, lim.BurstTokens)
		r.OverLimit, r.OverLease = max(r.OverLimit, a), max(r.OverLease, b)
		a, b = over(&c.tokG, lim.TPM, lim.BurstTokens)
		r.OverLimitGranted, r.OverLeaseGranted = max(r.OverLimitGranted, a), max(r.OverLeaseGranted, b)
	}
	r.FallbackUnits = float64(c.fbUnits)
	r.AllocErrors = c.allocErrors
	if c.admitted > 0 {
		r.CallsPerAdmit = float64(c.calls) / float64(c.admitted)
	}
	r.finishFairness()
	r.percentiles(c.waits)
	if s.svc != nil {
		r.Stranded = float64(c.granted + c.debt - c.returned - c.admittedUnits)
		r.StrandedFrac = r.Stranded / r.Allowed
	}
	if c.outTo > c.outFrom {
		r.OutageAdmitted, r.OutageOffered = c.outageAdmitted, c.outageOffered
		r.OutageWindow = time.Duration(c.outTo-c.outFrom) * time.Microsecond
	}
	return r
}
