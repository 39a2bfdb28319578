package spender_test

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/rationhq/ration"
	"github.com/rationhq/ration/internal/fakeclock"
	"github.com/rationhq/ration/spender"
)

// TestMetrics: the leased Limiter's metrics count admissions by path,
// rejections by reason, allocator calls, and actual over reserved usage.
func TestMetrics(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	m, err := spender.NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := spender.NewMetrics(reg); err == nil {
		t.Fatal("registering the metrics twice on one registry succeeded")
	}
	clk := fakeclock.New()
	l := newLeased(t, clk, newAllocator(t, clk), spender.WithMetrics(m))
	lim := ration.Limits{RPM: 3, TPM: 1000}
	mustReserve(t, l, "k", lim, ration.Amount{Requests: 1, Tokens: 400}).Settle(ration.Amount{Requests: 1, Tokens: 100})
	mustReserve(t, l, "k", lim, ration.Amount{Requests: 1, Tokens: 100}).Settle(ration.Amount{Requests: 1, Tokens: 100})
	mustReject(t, l, "k", lim, ration.Amount{Requests: 1, Tokens: 5000})
	mustReject(t, l, "k", lim, ration.Amount{Requests: 1, Tokens: 990})

	want := `
# HELP ration_spender_rejected_total Requests rejected, by reason: rate_limited, oversize, fail_closed.
# TYPE ration_spender_rejected_total counter
ration_spender_rejected_total{reason="fail_closed"} 0
ration_spender_rejected_total{reason="oversize"} 1
ration_spender_rejected_total{reason="rate_limited"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "ration_spender_rejected_total"); err != nil {
		t.Fatal(err)
	}
	if admitted := sumFamily(t, reg, "ration_spender_admitted_total"); admitted != 2 {
		t.Fatalf("admitted_total = %v, want 2", admitted)
	}
	if n, err := testutil.GatherAndCount(reg, "ration_spender_lease_calls_total", "ration_spender_usage_ratio", "ration_spender_lease_call_seconds"); err != nil || n < 3 {
		t.Fatalf("call and usage series: %d, %v", n, err)
	}
	if c := testutil.CollectAndCount(reg, "ration_spender_usage_ratio"); c != 1 {
		t.Fatalf("usage_ratio series = %d, want 1", c)
	}
}

// sumFamily adds up every series of the counter family name.
func sumFamily(t *testing.T, g prometheus.Gatherer, name string) float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}
