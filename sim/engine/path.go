package engine

import "github.com/rationhq/ration/spender"

// isFallback reports whether a leased spender admitted res under its
// fallback policy. TestIsFallbackMatchesMetrics checks it against the
// spender's own admitted_total{path="fallback"} counter.
func isFallback(res spender.Reservation) bool {
	return spender.AdmissionPath(res) == spender.PathFallback
}
