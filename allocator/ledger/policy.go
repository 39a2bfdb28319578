package ledger

import (
	"math/bits"
	"time"

	"github.com/rationhq/ration"
)

// Policy sizes leases: given one spender's demand on one dimension of a
// key and the key's state, it says how much to grant. The ledger clamps the
// answer to [Need, min(Want, Available)] when Need is covered, so a policy
// cannot break the bound, only share the budget well or badly. A Policy
// must be safe for concurrent use; it is called while a command applies
// and must not block. The simulator swaps it with WithPolicy.
type Policy interface {
	Grant(d Demand) int64
}

// Demand is what a Policy sees for one spender, key and dimension. Units
// are requests or tokens of that dimension.
type Demand struct {
	Want      int64         // asked for on top of Held
	Need      int64         // least useful grant (already known to be covered)
	Rate      int64         // this spender's observed spend per minute; 0 = unknown
	Held      int64         // this spender's holding after its return
	Available int64         // whole units in the global bucket now, >= Need
	Capacity  int64         // bucket capacity
	Refill    int64         // bucket refill per minute
	TTL       time.Duration // lease time to live
	Active    int           // spenders with an unexpired lease on the key, this one included
	RateSum   int64         // sum of Rate over the active spenders, this one included
}

// PolicyFunc adapts a function to Policy.
type PolicyFunc func(Demand) int64

// Grant calls f.
func (f PolicyFunc) Grant(d Demand) int64 { return f(d) }

// ShareByRate is the default policy: demand-capped proportional share with
// a fair-share floor (docs/allocator.md, "Lease sizing").
//
// A spender's demand over the next lease is its spend rate times the lease
// horizon (Horizon, default the TTL), minus what it holds, capped by Want;
// a spender with no history asks for Want. When the key's expected demand
// (RateSum over the horizon) fits in what is available, every spender gets
// its demand. When it does not, a spender gets the larger of its rate's
// proportion of the available budget and an equal split (Available/Active),
// never more than its demand. Nothing is granted beyond demand, so budget is
// not stranded at idle gateways, and a busy gateway is never held to less
// than an equal share.
type ShareByRate struct {
	// Horizon is how far ahead a lease should last at the observed rate;
	// 0 means the lease TTL.
	Horizon time.Duration
}

// Grant implements Policy.
func (p ShareByRate) Grant(d Demand) int64 {
	h := p.Horizon
	if h <= 0 {
		h = d.TTL
	}
	demand := d.Want
	if d.Rate > 0 {
		need := ratePer(d.Rate, h) - d.Held
		if need < demand {
			demand = need
		}
	}
	if demand <= 0 || d.Available <= 0 {
		return 0
	}
	expected := ratePer(d.RateSum, h)
	if d.RateSum == 0 || expected <= d.Available {
		return min(demand, d.Available)
	}
	active := int64(max(d.Active, 1))
	share := d.Available / active
	if d.Rate > 0 {
		hi, lo := bits.Mul64(uint64(d.Available), uint64(d.Rate))
		if hi < uint64(d.RateSum) {
			q, _ := bits.Div64(hi, lo, uint64(d.RateSum))
			share = max(share, int64(q))
		}
	}
	return min(demand, share)
}

// ratePer returns ceil(rate per minute × h), saturating.
func ratePer(rate int64, h time.Duration) int64 {
	if rate <= 0 || h <= 0 {
		return 0
	}
	hi, lo := bits.Mul64(uint64(rate), uint64(h))
	if hi >= uint64(time.Minute) {
		return ration.MaxAmount
	}
	q, r := bits.Div64(hi, lo, uint64(time.Minute))
	if r != 0 {
		q++
	}
	if q > ration.MaxAmount {
		return ration.MaxAmount
	}
	return int64(q)
}
