package spender_test

import (
	"testing"

	"github.com/rationhq/ration"
	"github.com/rationhq/ration/internal/fakeclock"
	"github.com/rationhq/ration/spender"
)

func TestAdmissionPath(t *testing.T) {
	clk := fakeclock.New()
	standalone := newLimiter(t, clk)
	if p := spender.AdmissionPath(mustReserve(t, standalone, "k", ration.Limits{RPM: 1}, ration.Amount{Requests: 1})); p != spender.PathStandalone {
		t.Errorf("standalone path %q", p)
	}
	if p := spender.AdmissionPath(mustReserve(t, standalone, "k", ration.Limits{}, ration.Amount{Requests: 1})); p != spender.PathUnlimited {
		t.Errorf("unlimited path %q", p)
	}
	l := newLeased(t, clk, newAllocator(t, clk))
	lim := ration.Limits{RPM: 600}
	if p := spender.AdmissionPath(mustReserve(t, l, "k", lim, ration.Amount{Requests: 1})); p != spender.PathSlow {
		t.Errorf("first leased admission path %q, want slow", p)
	}
	if p := spender.AdmissionPath(mustReserve(t, l, "k", lim, ration.Amount{Requests: 1})); p != spender.PathLease {
		t.Errorf("second leased admission path %q, want local", p)
	}
}
