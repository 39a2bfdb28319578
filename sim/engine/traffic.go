package engine

import (
	"math"
	"math/rand/v2"
	"time"

	"github.com/rationhq/ration"
	"github.com/rationhq/ration/internal/leasedrive"
	"github.com/rationhq/ration/spender"
)

// Token-scenario parameters: requests declare max_tokens 4096
// but produce 300 output tokens on average.
const (
	declaredMaxTokens = 4096
	meanOutputTokens  = 300
	minPrompt         = 10 // prompt tokens, uniform in [minPrompt, maxPrompt]
	maxPrompt         = 50
	// usedPerRequest is the expected tokens used per request: the mean
	// prompt plus the mean of min(ceil(Exp(300)), 4096), which is within
	// half a token of 300.5.
	usedPerRequest = (minPrompt+maxPrompt)/2.0 + meanOutputTokens + 0.5
)

// request is one simulated request from arrival to settlement. Requests
// live in a slab indexed by int32 so events can refer to them without
// pointers.
type request struct {
	origin   int32         // the instance the load balancer chose
	inst     int32         // the instance deciding it (the owner, for sticky)
	at       int64         // arrival, virtual µs
	cost     ration.Amount // reserved: 1 request, prompt + max_tokens
	actual   ration.Amount // settled: 1 request, prompt + output
	service  int64         // µs from admission to settlement
	res      spender.Reservation
	shadow   spender.Reservation // the ideal bucket's reservation, if it admitted
	parked   bool                // waiting for its spender's call
	wait     leasedrive.Wait     // leased: what to ask again with while parked
	ep       int32               // central: the endpoint deciding it
	decided  bool
	fallback bool // admitted under a leased spender's fallback policy
}

// traffic draws the arrivals of a scenario from its own random stream, so
// every strategy sees the same requests at the same instants.
type traffic struct {
	rng    *rand.Rand
	router *router
	gap    float64 // mean inter-arrival time, µs
	tokens bool
}

func newTraffic(c Config) *traffic {
	perSec := c.Overload * float64(c.Limits.RPM) / 60
	if c.Scenario.Tokens {
		perSec = c.Overload * float64(c.Limits.TPM) / 60 / usedPerRequest
	}
	return &traffic{
		rng:    rand.New(rand.NewPCG(c.Seed, 1)),
		router: newRouter(c.Scenario, c.Seed),
		gap:    1e6 / perSec,
		tokens: c.Scenario.Tokens,
	}
}

// next returns the arrival time following t (a Poisson process).
func (g *traffic) next(t int64) int64 {
	return t + 1 + int64(g.rng.ExpFloat64()*g.gap)
}

// fill draws the request arriving at t on one of live.
func (g *traffic) fill(r *request, t int64, live []int32) {
	*r = request{at: t, origin: g.router.pick(g.rng, t, live), ep: -1}
	r.inst = r.origin
	if !g.tokens {
		r.cost = ration.Amount{Requests: 1}
		r.actual = r.cost
		r.service = int64(500_000 + g.rng.Float64()*2_500_000) // 0.5 to 3 s
		return
	}
	prompt := int64(minPrompt + g.rng.IntN(maxPrompt-minPrompt+1))
	out := min(int64(math.Ceil(g.rng.ExpFloat64()*meanOutputTokens)), declaredMaxTokens)
	r.cost = ration.Amount{Requests: 1, Tokens: prompt + declaredMaxTokens}
	r.actual = ration.Amount{Requests: 1, Tokens: prompt + out}
	// Time to first token, then a stream of ~66 tokens a second.
	r.service = int64(300*time.Millisecond/time.Microsecond) + out*15_000
}
