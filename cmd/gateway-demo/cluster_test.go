package main

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/rationhq/ration/allocator"
	"github.com/rationhq/ration/gateway"
	"github.com/rationhq/ration/internal/testkit"
	leasev1 "github.com/rationhq/ration/proto/ration/lease/v1"
)

// follower is a cluster member that is not the leader: it refuses every
// call with NOT_LEADER naming leader.
type follower struct{ leader string }

func (f follower) Acquire(context.Context, *leasev1.AcquireRequest) (*leasev1.AcquireResponse, error) {
	return nil, testkit.NotLeader(f.leader)
}

func (f follower) ReserveAhead(context.Context, *leasev1.ReserveAheadRequest) (*leasev1.ReserveAheadResponse, error) {
	return nil, testkit.NotLeader(f.leader)
}

func (f follower) Release(context.Context, *leasev1.ReleaseRequest) (*leasev1.ReleaseResponse, error) {
	return nil, testkit.NotLeader(f.leader)
}

// TestRemoteClusterFollowsTheLeader: -allocator lists two members, the
// first a follower naming the second: the token check and every
// instance's calls reach the leader through it, requests are admitted,
// each instance's /metrics shows the leader and the redirect, and the
// instances give their leases back to the leader when they stop.
func TestRemoteClusterFollowsTheLeader(t *testing.T) {
	leaderURL, tokenFile, led := startLedger(t, 10*time.Second)
	mux := http.NewServeMux()
	allocator.Mount(mux, follower{leader: leaderURL})
	followerURL := testkit.H2C(t, mux)

	keys := writeKeys(t, []gateway.Key{{Key: "sk-c", ID: "c", Tenant: "t", RPM: 600, TPM: 600_000}})
	cfg := testConfig(t, 2, keys)
	cfg.allocatorURL, cfg.tokenFile = followerURL+","+leaderURL, tokenFile
	f := startFleet(t, cfg, nil)
	for i, inst := range f.instances {
		if status, body := rawChat(t, inst.url, "sk-c", "hello"); status != http.StatusOK {
			t.Fatalf("instance %d: %d %s", i+1, status, body)
		}
		for _, c := range []struct {
			name   string
			labels []string
			want   float64
		}{
			{"ration_spender_allocator_leader", []string{"member=" + leaderURL}, 1},
			{"ration_spender_allocator_leader", []string{"member=" + followerURL}, 0},
			{"ration_spender_leader_redirects_total", []string{"result=followed"}, 1},
			{"ration_spender_admitted_total", nil, 1},
		} {
			if got := metricValue(t, inst.reg, c.name, c.labels...); got != c.want {
				t.Errorf("instance %d: %s%v = %v, want %v", i+1, c.name, c.labels, got, c.want)
			}
		}
	}
	if got := led.Stats(); got.Spenders != 2 || got.Holdings == 0 {
		t.Errorf("the leader's ledger: %+v, want leases held by the 2 instances", got)
	}
	if err := f.stopInstances(t.Context()); err != nil {
		t.Fatal(err)
	}
	if got := led.Stats(); got.Holdings != 0 {
		t.Errorf("after the instances stopped: %+v, want no holdings", got)
	}
}
