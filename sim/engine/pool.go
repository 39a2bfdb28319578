package engine

import (
	"cmp"
	"math"
	"slices"
	"time"
)

// The tokens scenario as a pool of reservations (docs/performance.md,
// "Skew simulator"): each admitted request holds its reservation (prompt +
// max_tokens) until it settles, so the budget's capacity holds a number of
// requests at once, and near the limit that number, not the refill rate,
// decides who is admitted. Poisson arrivals finding every slot taken are
// refused: a loss system, whose admitted fraction is Erlang's loss formula
// whatever the service times' distribution.

// PoolModel is the tokens scenario's reservations seen as slots.
type PoolModel struct {
	Slots   int     // reservations the pool holds at once: its tokens ÷ the mean reservation
	Offered float64 // erlangs: arrivals per second × mean service time
	// Single is the fraction of arrivals one pool of Slots admits (the
	// ideal single bucket).
	Single float64
	// Split is the fraction admitted by the best fixed split of the slots
	// over the instances, each instance's arrivals its Zipf share: the
	// most any fleet admits whose instances admit only from slots they
	// hold, when the slots do not move within a service time.
	Split float64
	// NoSpare is the fraction of arrivals that land on an instance holding
	// no free slot, however the free slots are placed, while the fleet
	// admits what the single pool does: each such arrival waits for the
	// allocator or is refused where the single pool admits it.
	NoSpare float64
}

// TokensPool models c's tokens traffic (c.Scenario.Tokens; c's overload
// and instances) on a pool of the given tokens: the capacity C, or C +
// ρ·TTL, what a leased fleet in default mode may hold.
func TokensPool(c Config, tokens int64) PoolModel {
	c = c.withDefaults()
	reservation := meanPrompt + declaredMaxTokens
	service := (firstToken + time.Duration(meanOutput*float64(perOutputToken))).Seconds()
	m := PoolModel{
		Slots:   int(float64(tokens) / reservation),
		Offered: 1e6 / newTraffic(c, 0).gap * service,
	}
	m.Single = 1 - erlangB(m.Offered, m.Slots)
	shares := c.Scenario.Shares(c.Instances)
	m.Split = bestSplit(m.Offered, m.Slots, shares)
	slices.SortFunc(shares, func(a, b float64) int { return cmp.Compare(b, a) }) // busiest first
	// In flight in the single pool: Poisson(Offered) truncated at Slots.
	// With k in flight, Slots-k slots are free; placed on the busiest
	// instances, the arrivals at the others find none.
	norm, pmf := 0.0, make([]float64, m.Slots+1)
	for k := range pmf {
		pmf[k] = math.Exp(float64(k)*math.Log(m.Offered) - m.Offered - lgamma(k+1))
		norm += pmf[k]
	}
	for k, p := range pmf {
		if free := m.Slots - k; free < len(shares) {
			tail := 0.0
			for _, s := range shares[free:] {
				tail += s
			}
			m.NoSpare += p / norm * tail
		}
	}
	return m
}

// erlangB is the probability that a Poisson stream offering a erlangs to
// n servers finds them all busy (Erlang's loss formula, by its recurrence).
func erlangB(a float64, n int) float64 {
	b := 1.0
	for k := 1; k <= n; k++ {
		b = a * b / (float64(k) + a*b)
	}
	return b
}

// bestSplit is the fraction of a erlangs admitted when n slots are split
// over instances offered a × shares[i] each, split so as to admit the most:
// one slot at a time to the instance it gains most on (what an instance
// carries is concave in its slots, so this greedy split is optimal).
func bestSplit(a float64, n int, shares []float64) float64 {
	slots := make([]int, len(shares))
	for range n {
		best, gain := 0, -1.0
		for i, s := range shares {
			ai := a * s
			if g := ai * (erlangB(ai, slots[i]) - erlangB(ai, slots[i]+1)); g > gain {
				best, gain = i, g
			}
		}
		slots[best]++
	}
	carried := 0.0
	for i, s := range shares {
		carried += a * s * (1 - erlangB(a*s, slots[i]))
	}
	return carried / a
}

func lgamma(x int) float64 {
	v, _ := math.Lgamma(float64(x))
	return v
}
