package ledger

import (
	"math/bits"
	"slices"
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

// SharePolicy splits a key's refill rate into refill shares, one dimension
// at a time: given the demands of the key's active spenders, it says what
// share one of them should have (its fair share). The ledger grants that,
// clamped to what other spenders' shares leave free (they give back what
// they hold above their own fair shares when they renew), so a policy
// cannot break the bound, only share well or badly. Like Policy it must be
// safe for concurrent use and must not block.
type SharePolicy interface {
	Share(d ShareDemand) uint32
}

// ShareDemand is what a SharePolicy sees for one spender, key and
// dimension. Shares and demands are in millionths of the key's refill rate
// (ration.ShareUnit is the whole rate).
//
// A demand may exceed the whole rate (a gateway offered twice the key's
// limit asks 2,000,000), up to MaxShareDemand: capping it at the rate would
// count a gateway offered 4× the limit like one offered 1×, and a
// proportional split would then give it a quarter of its part.
type ShareDemand struct {
	Demand  uint32   // this spender's demand
	Demands []uint32 // the last demand of every spender holding a lease on the key, this one's included
}

// MaxShareDemand is the largest demand a ShareDemand carries, a thousand
// times the key's rate (millionths): what a spender asks beyond it counts
// as that.
const MaxShareDemand = 1000 * ration.ShareUnit

// ProportionalShare is the default share policy: every demand, raised by
// Headroom, when the demands fit in the rate (the rest of the rate refills
// the key's bucket, for cold starts and bursts); otherwise the rate split
// in proportion to the demands, so that every gateway's requests see the
// same admission probability. Doorman's PROPORTIONAL_SHARE is the same
// rule.
//
// Headroom (millionths of a demand; 0 = none) lets a spender's share run a
// little ahead of its measured demand, so that ordinary fluctuation does
// not send it to the allocator for amounts.
type ProportionalShare struct {
	Headroom uint32
}

// DefaultShareHeadroom is the headroom of the default share policy: a
// thirty-second on top of each demand (more is refill a gateway below its
// share cannot spend).
const DefaultShareHeadroom = ration.ShareUnit / 32

// MaxMinShare is max-min fairness (water filling) over the demands, each
// raised by Headroom: small demands are met in full and the large ones
// share the rest equally, so that no spender can get more without one that
// has less getting less (Doorman's FAIR_SHARE). Fair per gateway, not per
// request: a gateway with more traffic sees a lower admission probability.
type MaxMinShare struct {
	Headroom uint32
}

// Share implements SharePolicy.
func (p MaxMinShare) Share(d ShareDemand) uint32 {
	return min(withHeadroom(d.Demand, p.Headroom), waterLevel(d.Demands, p.Headroom))
}

// Share implements SharePolicy.
func (p ProportionalShare) Share(d ShareDemand) uint32 {
	want := raised(d.Demand, p.Headroom)
	var sum uint64
	for _, x := range d.Demands {
		sum += raised(x, p.Headroom)
	}
	if sum > ration.ShareUnit {
		want = want * ration.ShareUnit / sum // want <= sum: no overflow past ShareUnit
	}
	return uint32(min(want, ration.ShareUnit))
}

// raised is a demand raised by h millionths, not capped.
func raised(x, h uint32) uint64 {
	return uint64(x) * (ration.ShareUnit + uint64(h)) / ration.ShareUnit
}

// withHeadroom is a demand raised by h millionths, capped at the whole rate.
func withHeadroom(x, h uint32) uint32 {
	return uint32(min(raised(x, h), ration.ShareUnit))
}

// waterLevel is the max-min fair level for demands (each raised by h): the
// largest share any one gets when the whole rate is split, or the whole
// rate when the demands fit in it.
func waterLevel(demands []uint32, h uint32) uint32 {
	w := make([]uint32, len(demands))
	for i, x := range demands {
		w[i] = withHeadroom(x, h)
	}
	slices.Sort(w)
	left := uint64(ration.ShareUnit)
	for i, x := range w {
		rest := uint64(len(w) - i)
		if uint64(x)*rest > left {
			return uint32(left / rest)
		}
		left -= uint64(x)
	}
	return ration.ShareUnit
}
