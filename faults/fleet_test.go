//go:build faults

package faults

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"
)

// fleet is one allocator process, or a cluster of them, and gateway-demo
// processes spending one key through it: the setup of the allocator fault
// cases.
type fleet struct {
	alloc   *allocatorProc // the lone allocator; nil with a cluster
	cluster *allocCluster  // the cluster; nil with a lone allocator
	gws     []*gatewayProc
	name    string // fleetSpec.name
	key     key
	rpm     int
	ttl     time.Duration
}

// fleetSpec says how many gateway processes, each with how many
// instances, spend a key of rpm requests a minute from an allocator with
// lease TTL ttl: one process, or with members > 0 a cluster of that many.
type fleetSpec struct {
	name      string // for spender ids and process names
	rpm       int
	ttl       time.Duration
	procs     int
	instances int
	dataDir   string        // the lone allocator's; "" = a temp dir
	members   int           // > 0: a cluster of this many members (startCluster), each on its own data dir
	election  time.Duration // the cluster's election timeout
}

func startFleet(ctx context.Context, t *testing.T, s fleetSpec) *fleet {
	t.Helper()
	f := &fleet{key: key{Key: "sk-faults-" + s.name, ID: "faults-" + s.name, Tenant: "faults", RPM: s.rpm},
		name: s.name, rpm: s.rpm, ttl: s.ttl}
	var alloc allocatorAddr
	if s.members > 0 {
		f.cluster = startCluster(ctx, t, s.members, s.ttl, s.election)
		alloc = f.cluster
	} else {
		f.alloc = startAllocator(ctx, t, s.ttl, s.dataDir)
		alloc = f.alloc
	}
	keys := writeKeys(t, f.key)
	for i := range s.procs {
		f.gws = append(f.gws, startGateway(ctx, t, fmt.Sprintf("gateway %d", i+1), gatewaySpec{
			instances: s.instances, keysFile: keys, alloc: alloc, spenderID: fmt.Sprintf("faults-%s-%d", s.name, i+1)}))
	}
	return f
}

// spenderOf is the spender id of gateway process i's instance j (both
// from 0): the demo names instance j of -spender-id P "P-(j+1)".
func (f *fleet) spenderOf(i, j int) string { return fmt.Sprintf("faults-%s-%d-%d", f.name, i+1, j+1) }

func (f *fleet) urls() []string { return urlsOf(f.gws...) }

// overLimit starts a load of rate requests a second over every instance,
// and waits until the key's bucket is spent (the first 429): from then on
// every admission needs budget the allocator grants as it refills, which
// is where a fault could let too much through.
func (f *fleet) overLimit(ctx context.Context, t *testing.T, rate float64) *load {
	t.Helper()
	l := startLoad(ctx, loadSpec{key: f.key.Key, targets: f.urls(), rate: rate, workers: 96})
	err := poll(ctx, 50*time.Millisecond, func() (bool, error) { return l.count(429) > 0, nil })
	if err != nil {
		t.Fatalf("the load never spent the key's bucket (%d answers 200): %v", l.count(200), err)
	}
	t.Logf("bucket spent after %v (%d admitted)", time.Since(l.start).Round(time.Millisecond), l.count(200))
	return l
}

// waitLeased waits until the gateways admit from leases again: at least
// n more lease admissions than in since, and no instance in fallback. It
// returns how long that took.
func (f *fleet) waitLeased(ctx context.Context, t *testing.T, since gatewayCounts, n float64) time.Duration {
	t.Helper()
	start := time.Now()
	var last gatewayCounts
	err := poll(ctx, 100*time.Millisecond, func() (bool, error) {
		c, err := readGateways(ctx, f.urls())
		if err != nil {
			return false, err
		}
		last = c
		return c.leased-since.leased >= n && c.inFallback == 0, nil
	})
	if err != nil {
		t.Fatalf("the gateways did not go back to leases (%.0f lease admissions since, want %.0f; %.0f instances in fallback): %v",
			last.leased-since.leased, n, last.inFallback, err)
	}
	return time.Since(start)
}

// waitServed waits until every gateway instance counts the allocator as
// reachable again: its fallback gauge 0 and its /readyz 200
// (Limiter.Ready). It returns how long that took. Unlike waitLeased it
// does not wait for admissions from leases, which after a long fallback
// come only once the key's bucket has paid off the fallback admissions'
// debt (tens of seconds at this refill; meanwhile the allocator answers
// with the wait, so a spender may not even call).
func (f *fleet) waitServed(ctx context.Context, t *testing.T) time.Duration {
	t.Helper()
	start := time.Now()
	var waiting []string
	err := poll(ctx, 100*time.Millisecond, func() (bool, error) {
		waiting = waiting[:0]
		for _, u := range f.urls() {
			c, err := readGateways(ctx, []string{u})
			if err != nil {
				return false, err
			}
			code, err := getStatus(ctx, u+"/readyz")
			if err != nil {
				return false, err
			}
			if c.inFallback > 0 || code != http.StatusOK {
				waiting = append(waiting, u)
			}
		}
		return len(waiting) == 0, nil
	})
	if err != nil {
		t.Fatalf("gateway instances %v still count the allocator unreachable: %v", waiting, err)
	}
	return time.Since(start)
}

// finish stops the load and checks what every allocator fault case
// promises: every answer 200 or 429, every gateway still running, the
// bound, no refused epoch. It returns the bound's terms.
func (f *fleet) finish(ctx context.Context, t *testing.T, l *load) (loadResult, gatewayCounts, boundReport) {
	t.Helper()
	res := l.stop(ctx, t)
	t.Logf("clients: %v", res)
	res.only200or429(t)
	for _, g := range f.gws {
		g.alive(t)
	}
	gw := mustReadGateways(ctx, t, f.urls())
	if gw.answered5xx > 0 {
		t.Errorf("the gateways answered %.0f requests with a 5xx", gw.answered5xx)
	}
	b := checkBound(t, run{rpm: f.rpm, ttl: f.ttl, clients: res, gw: gw})
	// The allocator's state survives each fault (durable across kill -9,
	// intact across a stop or a failed commit), so no spender's epoch or
	// sequence is ever refused.
	noEpochTrouble(t, f.gws...)
	return res, gw, b
}
