package engine

import (
	"time"

	"github.com/rationhq/ration"
	leasev1 "github.com/rationhq/ration/proto/ration/lease/v1"
	"github.com/rationhq/ration/spender"
)

// collector accumulates a run's measurements as events happen.
type collector struct {
	primary int // the budget the time series is in

	offered, admitted int64
	reservedTok       int64 // every charge's tokens
	usedTok           int64
	instOffered       []int64
	instAdmitted      []int64
	instIdeal         []int64 // the ideal bucket's admissions, by arrival instance
	outageAdmitted    []int64
	outageOffered     []int64
	outFrom, outTo    int64 // window for outageAdmitted
	half              int64 // virtual µs where the second half starts
	bud               []budgetCol
	calls             int64
	allocErrors       int64
	keyGrants         int64   // key entries the allocator answered, the whole run
	keyGrantsTraffic  int64   // of those, answered while traffic was offered
	refresh           int64   // the refresh interval active pairs are counted over, µs
	pairSeen          []int64 // by budget × instance: 1 + the last refresh interval offered a request, 0 never
	pairIntervals     int64   // (pair, interval) with a request offered
	activations       int64   // (pair, interval) offered a request where the pair was not in the interval before
	waits             []int64
	series            []Point
	cur               Point
	fallback          int64
	accrued           ration.Amount // what the spenders' refill shares added to their leases

	// The client contract (client.go).
	errs            []int64 // per refusal: Retry-After minus the ideal's wait, µs
	late, early     int64   // refusals later than the ideal's wait by more than the slack; earlier than it
	retries         int64   // the client's requests sent again after a refusal
	retriesAdmitted int64
	retriesIdeal    int64   // of those, admitted by the ideal
	retriesEarly    int64   // of those, sent before the ideal's exact wait at the refusal they follow
	lastEnd         []int64 // by instance: when its last request ended (settled or refused), µs
	idlePending     []bool  // by instance: an idle check is scheduled
	idleChecks      int64
	idleHolding     int64       // checks at which the instance still held budget
	idleKeys        int64       // of those, with keys in its spender
	idleShares      int64       // of those, with a refill share at the allocator
	idleHeld        int64       // the most units of the primary budget the allocator counted for one idle instance
	holds           []allocHold // by endpoint × budget: the allocator's holding as its last answer stated it
}

// allocHold is what the allocator's last answer to an endpoint said it
// holds on one budget, and until when the holding counts.
type allocHold struct {
	held   int64 // KeyGrant.held, in the budget's dimension
	share  bool  // a refill share was granted with it
	expiry int64 // the holding stops counting (µs): TTL after the last call that touched it
}

// budgetCol is what the collector keeps for one budget, in its dimension.
type budgetCol struct {
	tokens            bool  // measured in tokens (else requests)
	offeredUnits      int64 // what the offered requests would use
	admittedUnits     int64 // actual usage of the admitted requests
	idealUnits        int64
	secondHalf        int64  // admitted units arriving in the second half of the run
	req, tok          window // every admission
	reqG, tokG        window // admissions from grants only (fallback left out)
	reqOn, tokOn      bool
	fbUnits           int64 // units admitted under fallback
	granted, returned int64 // as applied by the allocator
	debt              int64
}

func (c *collector) init(s *sim) {
	n := s.cfg.Instances
	c.primary = s.primary
	c.instOffered, c.instAdmitted, c.instIdeal = make([]int64, n), make([]int64, n), make([]int64, n)
	c.outageAdmitted, c.outageOffered = make([]int64, n), make([]int64, n)
	c.half = s.end / 2
	c.bud = make([]budgetCol, len(s.budgets))
	c.refresh = max(1, int64(s.cfg.Refresh/time.Microsecond))
	c.pairSeen = make([]int64, len(s.budgets)*n)
	c.lastEnd, c.idlePending = make([]int64, n), make([]bool, n)
	for i, b := range s.budgets {
		lim := b.lim
		bc := &c.bud[i]
		bc.tokens = b.dim == spender.Tokens
		p := lim.Period()
		bc.req, bc.reqG, bc.reqOn = newWindow(lim.RPM, p), newWindow(lim.RPM, p), lim.RPM > 0
		bc.tok, bc.tokG, bc.tokOn = newWindow(lim.TPM, p), newWindow(lim.TPM, p), lim.TPM > 0
	}
	if s.outTo > s.outFrom {
		c.outFrom = s.outFrom + int64((s.cfg.TTL+s.cfg.SlowDeadline)/time.Microsecond)
		c.outTo = s.outTo
	}
}

// units is a cost in the budget's dimension.
func (b *budgetCol) units(x ration.Amount) int64 {
	if b.tokens {
		return x.Tokens
	}
	return x.Requests
}

// amountOf is a in b's dimension.
func (b *budgetCol) amountOf(a ration.Amount) int64 {
	if b.tokens {
		return a.Tokens
	}
	return a.Requests
}

func (b *budgetCol) amount(a *leasev1.Amount) int64 {
	if b.tokens {
		return a.GetTokens()
	}
	return a.GetRequests()
}

// primaryUnits is what r uses of the primary budget (0 if it is not
// charged to it).
func (c *collector) primaryUnits(r *request) int64 {
	for _, ch := range r.charges() {
		if int(ch.b) == c.primary {
			return c.bud[ch.b].units(ch.actual)
		}
	}
	return 0
}

func (c *collector) onOffer(s *sim, r *request) {
	c.offered++
	c.instOffered[r.origin]++
	iv := 1 + s.now/c.refresh
	for _, ch := range r.charges() {
		if p := &c.pairSeen[int(ch.b)*len(c.instOffered)+int(r.inst)]; *p != iv {
			if *p == 0 || *p < iv-1 {
				c.activations++ // not active in the interval before
			}
			*p = iv
			c.pairIntervals++
		}
	}
	if s.now >= c.outFrom && s.now < c.outTo {
		c.outageOffered[r.origin]++
	}
	for _, ch := range r.charges() {
		b := &c.bud[ch.b]
		b.offeredUnits += b.units(ch.actual)
	}
	c.cur.Offered += float64(c.primaryUnits(r))
}

func (c *collector) onIdeal(s *sim, r *request) {
	c.instIdeal[r.origin]++
	if r.attempt > 0 {
		c.retriesIdeal++
	}
	for _, ch := range r.charges() {
		b := &c.bud[ch.b]
		b.idealUnits += b.units(ch.actual)
	}
	c.cur.Ideal += float64(c.primaryUnits(r))
}

// admitted counts an admission (r.fb says which charges were admitted
// under the fallback policy): the reserved cost enters the windows now
// (net of the refund at settlement), the actual usage the totals.
func (c *collector) onAdmit(s *sim, r *request) {
	c.admitted++
	if r.attempt > 0 {
		c.retriesAdmitted++
	}
	c.instAdmitted[r.origin]++
	c.cur.Admitted += float64(c.primaryUnits(r))
	if s.now >= c.outFrom && s.now < c.outTo {
		c.outageAdmitted[r.inst]++
	}
	for i, ch := range r.charges() {
		b := &c.bud[ch.b]
		u := b.units(ch.actual)
		b.admittedUnits += u
		if r.at >= c.half {
			b.secondHalf += u
		}
		c.reservedTok += ch.cost.Tokens
		c.usedTok += ch.actual.Tokens
		fb := r.fb&(1<<i) != 0
		if fb {
			b.fbUnits += u
		}
		b.charge(s.now, fb, ch.cost.Requests, ch.cost.Tokens)
	}
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
	for i, ch := range r.charges() {
		c.bud[ch.b].charge(s.now, r.fb&(1<<i) != 0, ch.actual.Requests-ch.cost.Requests, ch.actual.Tokens-ch.cost.Tokens)
	}
}

// charge adds a net charge to the budget's windows; fb: it was admitted
// under the fallback policy.
func (b *budgetCol) charge(t int64, fb bool, req, tok int64) {
	if b.reqOn {
		b.req.add(t, req)
		if !fb {
			b.reqG.add(t, req)
		}
	}
	if b.tokOn {
		b.tok.add(t, tok)
		if !fb {
			b.tokG.add(t, tok)
		}
	}
}

// onAnswered counts the key entries of a call the allocator answered
// (replays from its exactly-once record and answers lost on the way back
// included): its per-key work.
func (c *collector) onAnswered(s *sim, keys int) {
	c.keyGrants += int64(keys)
	if s.now < s.end {
		c.keyGrantsTraffic += int64(keys)
	}
}

// onApplied records what the allocator did with one call of endpoint ep
// (each sequence once): the budget it moved, and the holding it states.
func (c *collector) onApplied(s *sim, ep int32, req *leasev1.AcquireRequest, resp *leasev1.AcquireResponse) {
	nb := len(c.bud)
	if need := (int(ep) + 1) * nb; len(c.holds) < need {
		c.holds = append(c.holds, make([]allocHold, need-len(c.holds))...)
	}
	for i, k := range req.GetKeys() {
		g := resp.GetKeys()[i]
		bi := int(s.budgetOf[k.GetKey()])
		b := &c.bud[bi]
		b.debt += b.amount(k.GetDebt())
		b.granted += b.amount(g.GetGranted())
		b.returned += b.amount(g.GetReturned())
		h := &c.holds[int(ep)*nb+bi]
		sh := g.GetShare()
		h.held, h.share = b.amount(g.GetHeld()), sh.GetRequestsPpm() > 0 || sh.GetTokensPpm() > 0
		h.expiry = max(h.expiry, s.now+int64(s.cfg.TTL/time.Microsecond))
	}
}

// onReleased records that endpoint ep's Release was applied: the
// allocator drops its holdings.
func (c *collector) onReleased(ep int32) {
	nb := len(c.bud)
	if end := (int(ep) + 1) * nb; end <= len(c.holds) {
		clear(c.holds[int(ep)*nb : end])
	}
}

// onRefusal records a refusal's Retry-After ra beside the ideal's exact
// wait for the same request at the same instant.
func (c *collector) onRefusal(ra, ideal time.Duration) {
	c.errs = append(c.errs, int64((ra-ideal)/time.Microsecond))
	switch {
	case ra > ideal+LateSlack+ideal/LateSlackDiv:
		c.late++
	case ra < ideal:
		c.early++
	}
}

// onIdle records what instance i still holds a TTL after its last
// request: keys in its spender, and the holdings the allocator's last
// answers to its endpoints stated that still count.
func (c *collector) onIdle(s *sim, i int32, keys int64) {
	c.idleChecks++
	nb := len(c.bud)
	var held int64               // units of the primary budget
	other, share := false, false // units held on any budget; a refill share
	for ep, e := range s.eps {
		if e.inst != i || (ep+1)*nb > len(c.holds) {
			continue
		}
		for bi, h := range c.holds[ep*nb : (ep+1)*nb] {
			if h.expiry <= s.now {
				continue
			}
			other, share = other || h.held > 0, share || h.share
			if bi == c.primary {
				held += h.held
			}
		}
	}
	if keys > 0 || other || share {
		c.idleHolding++
	}
	if keys > 0 {
		c.idleKeys++
	}
	if share {
		c.idleShares++
	}
	c.idleHeld = max(c.idleHeld, held)
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
	load := cfg.Overload
	if !cfg.Scenario.Loaded() {
		load = 0
	}
	r := &Result{
		Scenario: cfg.Scenario.Name, Strategy: cfg.Strategy, Instances: cfg.Instances, Overload: load,
		Duration: cfg.Duration, Seed: cfg.Seed, TTL: cfg.TTL,
		Offered: c.offered, Admitted: c.admitted,
		InstOffered: c.instOffered, InstAdmitted: c.instAdmitted, InstIdeal: c.instIdeal,
		Calls: c.calls, Fallback: c.fallback,
		ReservedTokens: c.reservedTok, UsedTokens: c.usedTok,
		Series: c.series,
	}
	T := cfg.Duration.Seconds()
	for i, b := range s.budgets {
		r.Budgets = append(r.Budgets, s.budgetResult(b, &c.bud[i], T))
	}
	p := &r.Budgets[s.primary]
	r.Primary = p.Name
	r.Dim, r.Capacity, r.Rate, r.Allowed = p.Dim, p.Capacity, p.Rate, p.Allowed
	r.AdmittedUnits, r.IdealUnits, r.AdmitFrac, r.VsIdeal, r.Steady = p.AdmittedUnits, p.IdealUnits, p.AdmitFrac, p.VsIdeal, p.Steady
	r.FallbackUnits = p.FallbackUnits
	r.Stranded, r.StrandedFrac, r.StrandedUnknown = p.Stranded, p.StrandedFrac, p.StrandedUnknown
	b0 := &r.Budgets[0]
	r.OverLimit, r.OverLease, r.OverLimitGranted, r.OverLeaseGranted = b0.OverLimit, b0.OverLease, b0.OverLimitGranted, b0.OverLeaseGranted
	for _, b := range r.Budgets[1:] {
		r.OverLimit, r.OverLease = max(r.OverLimit, b.OverLimit), max(r.OverLease, b.OverLease)
		r.OverLimitGranted, r.OverLeaseGranted = max(r.OverLimitGranted, b.OverLimitGranted), max(r.OverLeaseGranted, b.OverLeaseGranted)
	}
	r.AllocErrors = c.allocErrors
	if c.admitted > 0 {
		r.CallsPerAdmit = float64(c.calls) / float64(c.admitted)
	}
	r.KeyGrants, r.Refresh = c.keyGrants, cfg.Refresh
	r.KeyGrantsPerSec = float64(c.keyGrantsTraffic) / T
	intervals := (s.end + c.refresh - 1) / c.refresh
	r.ActivePairs = float64(c.pairIntervals) / float64(max(1, intervals))
	if r.ActivePairs > 0 {
		r.KeyGrantsPerPair = r.KeyGrantsPerSec / r.ActivePairs
	}
	r.PairIntervals, r.PairActivations = c.pairIntervals, c.activations
	if c.activations > 0 {
		r.KeyGrantsPerActivation = float64(c.keyGrantsTraffic) / float64(c.activations)
	}
	if sc := cfg.Scenario; sc.Tokens && sc.Charging == OneKey {
		tokens := r.Capacity
		if cfg.Strategy == Leased {
			tokens += int64(float64(cfg.Limits.TPM) * cfg.TTL.Seconds() / cfg.Limits.Period().Seconds())
		}
		m := TokensPool(cfg, tokens)
		r.SplitVsIdeal = m.Split / m.Single
	}
	r.retryErrors(c.errs, c.late, c.early)
	r.Retries, r.RetriesAdmitted, r.RetriesIdeal, r.RetriesEarly = c.retries, c.retriesAdmitted, c.retriesIdeal, c.retriesEarly
	r.IdleChecks, r.IdleHolding, r.IdleKeys, r.IdleShares = c.idleChecks, c.idleHolding, c.idleKeys, c.idleShares
	r.IdleHeld = float64(c.idleHeld)
	r.finishFairness()
	r.percentiles(c.waits)
	if c.outTo > c.outFrom {
		r.OutageAdmitted, r.OutageOffered = c.outageAdmitted, c.outageOffered
		r.OutageWindow = time.Duration(c.outTo-c.outFrom) * time.Microsecond
	}
	return r
}

// budgetResult is what the run measured for budget b, over T seconds of
// traffic.
func (s *sim) budgetResult(b budget, bc *budgetCol, T float64) BudgetResult {
	cfg := s.cfg
	lim := b.lim
	capOf := func(rate, burst int64) int64 {
		if burst > 0 {
			return burst
		}
		return rate
	}
	br := BudgetResult{Name: b.name, Limits: lim, Dim: b.dim,
		OfferedUnits: float64(bc.offeredUnits), AdmittedUnits: float64(bc.admittedUnits), IdealUnits: float64(bc.idealUnits)}
	rateMin := lim.RPM
	br.Capacity = capOf(lim.RPM, lim.BurstRequests)
	if b.dim == spender.Tokens {
		rateMin, br.Capacity = lim.TPM, capOf(lim.TPM, lim.BurstTokens)
	}
	period := lim.Period()
	br.Rate = float64(rateMin) / period.Seconds()
	br.Allowed = float64(br.Capacity) + br.Rate*T
	br.AdmitFrac = br.AdmittedUnits / br.Allowed
	if br.IdealUnits > 0 {
		br.VsIdeal = br.AdmittedUnits / br.IdealUnits
	}
	br.Steady = float64(bc.secondHalf) / (br.Rate * (T - float64(s.col.half)/1e6))
	over := func(w *window, rate, burst int64) (limit, lease float64) {
		C := float64(capOf(rate, burst))
		ex := w.maxExcess()
		return (ex - C) / C, (ex - C - float64(rate)*cfg.TTL.Seconds()/period.Seconds()) / C
	}
	br.OverLimit, br.OverLease, br.OverLimitGranted, br.OverLeaseGranted = -1, -1, -1, -1
	if bc.reqOn {
		br.OverLimit, br.OverLease = over(&bc.req, lim.RPM, lim.BurstRequests)
		br.OverLimitGranted, br.OverLeaseGranted = over(&bc.reqG, lim.RPM, lim.BurstRequests)
	}
	if bc.tokOn {
		a, b := over(&bc.tok, lim.TPM, lim.BurstTokens)
		ag, bg := over(&bc.tokG, lim.TPM, lim.BurstTokens)
		if bc.reqOn {
			a, b, ag, bg = max(br.OverLimit, a), max(br.OverLease, b), max(br.OverLimitGranted, ag), max(br.OverLeaseGranted, bg)
		}
		br.OverLimit, br.OverLease, br.OverLimitGranted, br.OverLeaseGranted = a, b, ag, bg
	}
	br.FallbackUnits = float64(bc.fbUnits)
	if s.svc != nil {
		// What refill shares added to the leases was taken from the
		// bucket's refill too. The spenders count it per dimension, not per
		// key: with one budget it is that budget's; with several it cannot
		// be told apart, and stranded is unknown.
		granted := bc.granted
		switch acc := bc.amountOf(s.col.accrued); {
		case len(s.col.bud) == 1:
			granted += acc
		case acc > 0:
			br.StrandedUnknown = true
		}
		if !br.StrandedUnknown {
			br.Stranded = float64(granted + bc.debt - bc.returned - bc.admittedUnits)
			br.StrandedFrac = br.Stranded / br.Allowed
		}
	}
	return br
}
