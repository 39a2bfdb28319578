//go:build faults

package faults

import (
	"fmt"
	"testing"
	"time"
)

// run is what one case's traffic on one key came to: the counts the bound
// is checked against.
type run struct {
	rpm     int           // the key's limit: capacity C = rpm requests, refill ρ = rpm/60 a second
	ttl     time.Duration // the allocator's lease TTL
	clients loadResult    // what the test's clients saw; clients.elapsed is the window t
	gw      gatewayCounts // the gateways' counters after the last answer
}

// boundReport is the bound's terms for one run, for logs and docs.
type boundReport struct {
	t                 time.Duration
	admitted          float64 // what the gateways' Limiters admitted (all paths)
	fallback          float64 // of which under the fallback policy
	leasedMax         float64 // C + ρ·(t + TTL)
	fallbackMax       float64 // C + ρ·t
	allows            float64 // C + ρ·t: what the limit itself allows over t
	clientOK, gateway float64 // 200s counted by the clients and by the gateways
}

func (b boundReport) String() string {
	return fmt.Sprintf("admitted %.0f in t=%.1fs (clients counted %.0f×200, gateways %.0f×200), of which %.0f under fallback; "+
		"bound: leased %.0f <= C+ρ(t+TTL) = %.1f, fallback %.0f <= C+ρt = %.1f; utilisation %.1f%% of C+ρt",
		b.admitted, b.t.Seconds(), b.clientOK, b.gateway, b.fallback, b.admitted-b.fallback, b.leasedMax,
		b.fallback, b.fallbackMax, 100*b.admitted/b.allows)
}

// checkBound checks the over-admission bound of docs/bound.md from counts.
//
// For one key with capacity C (its RPM), refill ρ = C/60 a second and
// lease TTL, docs/bound.md ("The bound and why it holds", default mode)
// bounds the cost admitted in any window of length t by
//
//	C + ρ·(t + TTL) + D,
//
// D being the debt the key's bucket still owes at the window's end. The
// only debt these runs make is fallback admissions reported on recovery
// (a request costs exactly one request, so settlement never overruns),
// and the proof counts each as an admission too (it lowers the level
// once on each side), so the admissions from leases alone are at most
// C + ρ·(t + TTL). Fallback admissions are outside that bound;
// docs/leasing.md ("The bound while in fallback") bounds them under the
// default FallbackShare policy: each of N spenders admits at most
// C/N + (ρ/N)·t from its fallback buckets, or with refill shares C·f + ρ·f·t
// at its fallback part f (its share plus an even part of the unshared
// rate), so the fleet at most C + ρ·t.
// So, over the run's window t (before the first request to after the
// last answer; the key is fresh, so nothing was admitted before it):
//
//	admitted − fallback ≤ C + ρ·(t + TTL)
//	fallback            ≤ C + ρ·t
//
// "Admitted" is the gateways' own count (ration_spender_admitted_total,
// every path), which must cover every 200 the clients counted; the 200s
// the clients and the gateways counted must agree (when no client request
// failed, they are the same requests).
func checkBound(t *testing.T, r run) boundReport {
	t.Helper()
	c := float64(r.rpm)
	rho := c / 60
	el := r.clients.elapsed
	b := boundReport{
		t:           el,
		admitted:    r.gw.admitted,
		fallback:    r.gw.fallback,
		leasedMax:   c + rho*(el+r.ttl).Seconds(),
		fallbackMax: c + rho*el.Seconds(),
		allows:      c + rho*el.Seconds(),
		clientOK:    float64(r.clients.count(200)),
		gateway:     r.gw.answered200,
	}
	failed := r.clients.count(0) > 0
	switch {
	case !failed && b.clientOK != b.gateway:
		t.Errorf("clients counted %.0f answers 200, the gateways %.0f", b.clientOK, b.gateway)
	case failed && b.clientOK > b.gateway:
		t.Errorf("clients counted %.0f answers 200, more than the gateways' %.0f", b.clientOK, b.gateway)
	}
	if b.admitted < b.gateway {
		t.Errorf("the gateways answered %.0f requests 200 but their Limiters admitted only %.0f", b.gateway, b.admitted)
	}
	if b.admitted-b.fallback > b.leasedMax {
		t.Errorf("over-admission: %.0f admitted from leases in %v, above C+ρ(t+TTL) = %.1f (C=%d, TTL=%v)",
			b.admitted-b.fallback, el, b.leasedMax, r.rpm, r.ttl)
	}
	if b.fallback > b.fallbackMax {
		t.Errorf("over-admission: %.0f admitted under the fallback policy in %v, above C+ρt = %.1f", b.fallback, el, b.fallbackMax)
	}
	t.Logf("bound: %v", b)
	return b
}
