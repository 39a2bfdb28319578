package engine

import (
	"math"
	"testing"
)

func TestErlangB(t *testing.T) {
	for _, tc := range []struct {
		a    float64
		n    int
		want float64
	}{
		{1, 0, 1},
		{1, 1, 0.5},
		{2, 2, 0.4},        // (4/2) / (1 + 2 + 4/2)
		{10, 10, 0.214582}, // the textbook table
	} {
		if got := erlangB(tc.a, tc.n); math.Abs(got-tc.want) > 5e-7 {
			t.Errorf("erlangB(%v, %d) = %.7f, want %.7f", tc.a, tc.n, got, tc.want)
		}
	}
	// Against the definition, (a^n/n!) / sum over k <= n of a^k/k!, in
	// logarithms so that large n do not overflow.
	for _, tc := range []struct {
		a float64
		n int
	}{{100, 120}, {232.7, 290}, {5, 3}, {0.5, 4}} {
		terms := make([]float64, tc.n+1)
		for k := range terms {
			terms[k] = float64(k)*math.Log(tc.a) - lgamma(k+1)
		}
		sum := 0.0
		for _, lt := range terms {
			sum += math.Exp(lt - terms[tc.n])
		}
		if got, want := erlangB(tc.a, tc.n), 1/sum; math.Abs(got-want) > 1e-9*max(1, want) {
			t.Errorf("erlangB(%v, %d) = %.10g, the definition gives %.10g", tc.a, tc.n, got, want)
		}
	}
}

// TestTokensPool states the tokens scenario's pool arithmetic that
// docs/performance.md quotes (at 0.8× the limit), and checks the model
// against itself: a split pool admits no more than one pool, and fewer
// free slots than instances leave some arrivals without one.
func TestTokensPool(t *testing.T) {
	sc, err := ScenarioByName("tokens")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		n                            int
		load                         float64
		mode                         string
		single, split, noSpare, prec float64
	}{
		{8, 0.8, "strict", 1, 0.975, 0, 0.001},
		{64, 0.8, "strict", 1, 0.855, 0.033, 0.001},
		{8, 0.8, "default", 1, 0.997, 0, 0.001},
		{64, 0.8, "default", 1, 0.914, 0, 0.001},
		{8, 2, "strict", 0.497, 0.986, 0.734, 0.001},
		{64, 2, "strict", 0.497, 0.951, 0.832, 0.001},
	} {
		c := Config{Scenario: sc, Instances: tc.n, Overload: tc.load}.withDefaults()
		tokens := c.Limits.Capacity().Tokens
		if tc.mode == "default" {
			tokens += c.Limits.TPM * int64(c.TTL) / int64(60e9)
		}
		m := TokensPool(c, tokens)
		t.Logf("N=%d %.1fx %s: %d slots, %.1f erlangs offered; one pool admits %.4f, the best fixed split %.4f (%.4f of one pool); %.4f of arrivals find no free slot on their instance",
			tc.n, tc.load, tc.mode, m.Slots, m.Offered, m.Single, m.Split, m.Split/m.Single, m.NoSpare)
		if m.Split > m.Single+1e-12 || m.NoSpare < 0 || m.NoSpare > 1 {
			t.Errorf("N=%d %s: split %.4f above one pool %.4f, or no-spare %.4f out of range", tc.n, tc.mode, m.Split, m.Single, m.NoSpare)
		}
		if math.Abs(m.Single-tc.single) > tc.prec || math.Abs(m.Split/m.Single-tc.split) > tc.prec || math.Abs(m.NoSpare-tc.noSpare) > tc.prec {
			t.Errorf("N=%d %s: %.4f, %.4f, %.4f; docs/performance.md says %.3f, %.3f, %.3f", tc.n, tc.mode, m.Single, m.Split/m.Single, m.NoSpare, tc.single, tc.split, tc.noSpare)
		}
	}
}
