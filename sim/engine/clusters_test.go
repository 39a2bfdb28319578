package engine

import (
	"math"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rationhq/ration/spender"
)

// TestClusterLossStaysOnItsKeys: over three clusters, one lost from 40% to
// 60% of the run, leased, each key is decided on the cluster spender.Route
// names; the other clusters' keys admit no differently during the loss (as
// close to the ideal as over the whole run, nothing by fallback), while
// the lost cluster's keys fall back to their share and admit no more than
// the ideal then; every key's grants stay within C + rho*(t + TTL)
// (TestBoundsHold checks both leased strategies on the whole scenario,
// fallback included).
func TestClusterLossStaysOnItsKeys(t *testing.T) {
	sc := scenario(t, "clusters")
	cl := *sc.Clusters
	cl.Keys = 30 // of 60: the test's time under -race
	sc.Clusters = &cl
	r := mustRun(t, Config{Scenario: sc, Strategy: Leased, Duration: 2 * time.Minute, Seed: 7})
	var keys []string
	var admitted float64
	for _, c := range r.Clusters {
		for _, k := range c.Keys {
			if got := cl.Names[spender.Route(cl.Names, k)]; got != c.Name {
				t.Errorf("%s was decided on %s; Route names %s", k, c.Name, got)
			}
		}
		keys = append(keys, c.Keys...)
		admitted += c.AdmittedUnits
		switch {
		case c.Lost && (c.Fallback == 0 || c.VsIdealLoss > 1):
			t.Errorf("lost cluster %s: %d fallback admissions, %.1f%% of the ideal during the loss; want its keys on their fallback share",
				c.Name, c.Fallback, 100*c.VsIdealLoss)
		case !c.Lost && (c.Fallback != 0 || c.VsIdealLoss < 0.95 || math.Abs(c.VsIdealLoss-c.VsIdeal) > 0.02):
			t.Errorf("cluster %s during the loss of another: %d fallback admissions, %.1f%% of the ideal (%.1f%% over the run); want unaffected",
				c.Name, c.Fallback, 100*c.VsIdealLoss, 100*c.VsIdeal)
		}
		if len(c.Keys) == 0 { // how evenly keys spread is spender.TestRouteSpreadsKeys's
			t.Errorf("cluster %s has none of the keys", c.Name)
		}
		t.Logf("cluster %s (lost %v): %d keys, %.1f%% of the ideal, %.1f%% during the loss, %d fallback admissions",
			c.Name, c.Lost, len(c.Keys), 100*c.VsIdeal, 100*c.VsIdealLoss, c.Fallback)
	}
	slices.Sort(keys)
	var names []string
	for _, b := range r.Budgets {
		names = append(names, b.Name)
		if b.OverLeaseGranted > 0 {
			t.Errorf("%s: admissions from grants %.2f%% of C past the bound", b.Name, 100*b.OverLeaseGranted)
		}
	}
	if !slices.Equal(keys, names) || len(keys) != 30 {
		t.Errorf("the clusters hold %d keys, the run %d", len(keys), len(names))
	}
	if math.Abs(admitted-r.AdmittedUnits) > 0.5 {
		t.Errorf("the clusters admitted %.0f, the run %.0f", admitted, r.AdmittedUnits)
	}
}

// TestClustersSameSeedSameResult: a run over several clusters is a
// function of its Config, like any run.
func TestClustersSameSeedSameResult(t *testing.T) {
	cfg := Config{Scenario: scenario(t, "clusters"), Strategy: Leased, Duration: 20 * time.Second, Seed: 9}
	a, b := mustRun(t, cfg), mustRun(t, cfg)
	if !reflect.DeepEqual(a, b) {
		t.Fatalf("two runs with seed 9 differ:\n%+v\n%+v", a, b)
	}
}

// TestClustersRefuses: a cluster list the run cannot use is an error.
func TestClustersRefuses(t *testing.T) {
	for _, tc := range []struct {
		name string
		cl   Clusters
		says string
	}{
		{"no clusters", Clusters{}, "no clusters"},
		{"lost unknown", Clusters{Names: []string{"a", "b"}, Lost: "z"}, `"z"`},
	} {
		sc := Scenario{Name: "x", Skew: Zipf, Clusters: &tc.cl}
		if _, err := Run(Config{Scenario: sc, Strategy: Leased, Duration: time.Second}); err == nil || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("%s: %v; want an error saying %s", tc.name, err, tc.says)
		}
	}
}
