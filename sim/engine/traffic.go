package engine

import (
	"math"
	"math/rand/v2"
	"time"

	"github.com/rationhq/ration"
	"github.com/rationhq/ration/spender"
)

// Token-scenario parameters: requests declare max_tokens 4096
// but produce 300 output tokens on average.
const (
	declaredMaxTokens = 4096
	meanOutputTokens  = 300
	minPrompt         = 10 // prompt tokens, uniform in [minPrompt, maxPrompt]
	maxPrompt         = 50
	meanPrompt        = (minPrompt + maxPrompt) / 2.0
	// meanOutput is the mean of min(ceil(Exp(300)), 4096), within half a
	// token of 300.5; usedPerRequest the expected tokens used per request.
	meanOutput     = meanOutputTokens + 0.5
	usedPerRequest = meanPrompt + meanOutput
	// A request's service time is time to first token, then a stream of
	// ~66 tokens a second.
	firstToken     = 300 * time.Millisecond
	perOutputToken = 15 * time.Millisecond
	// A request scenario's request takes 0.5 to 3 s.
	minService = 500 * time.Millisecond
	maxService = 3 * time.Second
)

// maxCharges is the most budgets a simulated request is charged to.
const maxCharges = 2

// charge is what a request costs one budget: reserved at admission
// (cost), settled at the end (actual).
type charge struct {
	b      int32 // the budget, an index into sim.budgets
	cost   ration.Amount
	actual ration.Amount
}

// request is one simulated request from arrival to settlement. Requests
// live in a slab indexed by int32 so events can refer to them without
// pointers.
type request struct {
	origin  int32 // the instance the load balancer chose
	inst    int32 // the instance deciding it (the owner, for sticky)
	at      int64 // arrival, virtual µs
	key     int32 // the API key sending it (a team's key; 0 otherwise)
	nch     int32 // charges in ch; 1 for a one-key scenario
	ch      [maxCharges]charge
	service int64 // µs from admission to settlement
	// res is the admission of a request with one charge, all of one with
	// several (a *spender.Reservations, or central's); shadow and
	// shadowAll are the ideal buckets' admission, if they admitted.
	res       spender.Reservation
	all       multiRes
	shadow    spender.Reservation
	shadowAll *spender.Reservations
	parked    bool          // waiting for its spender's call
	wait      *spender.Wait // leased: what to ask again with while parked
	ep        int32         // central: the endpoint deciding it
	decided   bool
	fb        uint32 // bit i: charge i was admitted under a leased spender's fallback policy

	// The client contract. client: sent by the scenario's client, which
	// honours Retry-After; attempt: 0 for its first sending, n for its
	// n-th retry; idealWait: the ideal's wait for it at arrival, 0 if the
	// ideal admitted it.
	client    bool
	attempt   int32
	idealWait time.Duration
}

// multiRes is the admission of a request charged to several budgets:
// Settle settles charge i with actual[i].
type multiRes interface {
	Settle(actual []ration.Amount) error
}

var _ multiRes = (*spender.Reservations)(nil)

// traffic draws the arrivals of a scenario from its own random stream, so
// every strategy sees the same requests at the same instants.
type traffic struct {
	rng      *rand.Rand
	router   *router
	gap      float64 // mean inter-arrival time, µs
	tokens   bool
	charging Charging
	keyCum   []float64 // cumulative key shares, for a team
	team     int32     // the team's budget
	in, out  int32     // the input and output budgets
}

func newTraffic(c Config, primary int) *traffic {
	period := c.Limits.Period().Seconds()
	perSec := c.Overload * float64(c.Limits.RPM) / period
	if c.Scenario.Tokens {
		perSec = c.Overload * float64(c.Limits.TPM) / period / usedPerRequest
	}
	g := &traffic{
		rng:      rand.New(rand.NewPCG(c.Seed, 1)),
		router:   newRouter(c.Scenario, c.Seed),
		gap:      1e6 / perSec,
		tokens:   c.Scenario.Tokens,
		charging: c.Scenario.Charging,
		team:     int32(primary),
		in:       0,
		out:      1,
	}
	acc := 0.0
	for _, v := range c.Scenario.keyShares() {
		acc += v
		g.keyCum = append(g.keyCum, acc)
	}
	return g
}

// next returns the arrival time following t (a Poisson process).
func (g *traffic) next(t int64) int64 {
	return t + 1 + int64(g.rng.ExpFloat64()*g.gap)
}

// longest is the longest a request of this traffic takes from admission
// to settlement.
func (g *traffic) longest() time.Duration {
	if g.tokens {
		return firstToken + declaredMaxTokens*perOutputToken
	}
	return maxService
}

// fill draws the request arriving at t on one of live.
func (g *traffic) fill(r *request, t int64, live []int32) { g.draw(g.rng, r, t, live) }

// draw draws a request arriving at t on one of live from rng: the
// traffic's own stream, or the client's (whose requests depend on what
// the strategy admitted, and so must not move the traffic's).
func (g *traffic) draw(rng *rand.Rand, r *request, t int64, live []int32) {
	*r = request{at: t, ep: -1, nch: 1}
	if g.charging == KeyAndTeam {
		u := rng.Float64()
		r.key = int32(len(g.keyCum) - 1)
		for k, c := range g.keyCum {
			if u < c {
				r.key = int32(k)
				break
			}
		}
	}
	r.origin = g.router.pick(rng, t, live, int(r.key))
	r.inst = r.origin
	if !g.tokens {
		one := ration.Amount{Requests: 1}
		r.ch[0] = charge{b: 0, cost: one, actual: one}
		if g.charging == KeyAndTeam {
			r.ch[0].b = r.key
			r.ch[1] = charge{b: g.team, cost: one, actual: one}
			r.nch = 2
		}
		r.service = int64(float64(minService/time.Microsecond) + rng.Float64()*float64((maxService-minService)/time.Microsecond))
		return
	}
	prompt := int64(minPrompt + rng.IntN(maxPrompt-minPrompt+1))
	out := min(int64(math.Ceil(rng.ExpFloat64()*meanOutputTokens)), declaredMaxTokens)
	if g.charging == InputOutput {
		// The prompt is known when the request arrives: reserved and
		// settled alike. The output reserves max_tokens.
		r.ch[0] = charge{b: g.in, cost: ration.Amount{Requests: 1, Tokens: prompt}, actual: ration.Amount{Requests: 1, Tokens: prompt}}
		r.ch[1] = charge{b: g.out, cost: ration.Amount{Requests: 1, Tokens: declaredMaxTokens}, actual: ration.Amount{Requests: 1, Tokens: out}}
		r.nch = 2
	} else {
		r.ch[0] = charge{cost: ration.Amount{Requests: 1, Tokens: prompt + declaredMaxTokens}, actual: ration.Amount{Requests: 1, Tokens: prompt + out}}
	}
	r.service = int64((firstToken + time.Duration(out)*perOutputToken) / time.Microsecond)
}

// charges returns r's charges.
func (r *request) charges() []charge { return r.ch[:r.nch] }
