package engine

import (
	"reflect"

	"github.com/rationhq/ration/spender"
)

// fallbackPath is the value of spender's unexported admitPath for an
// admission under the fallback policy (pathLocal, pathSlow, pathFallback,
// pathAhead in that order).
const fallbackPath = 2

// isFallback reports whether a leased spender admitted res under its
// fallback policy. The spender does not export an admission's path, so
// this reads the unexported field by reflection (reading is allowed;
// nothing is written). TestIsFallbackMatchesMetrics checks it against the
// spender's own admitted_total{path="fallback"} counter, so a change in
// the spender breaks a test instead of skewing the bound check. An
// exported accessor in spender would replace this.
func isFallback(res spender.Reservation) bool {
	v := reflect.ValueOf(res)
	if v.Kind() != reflect.Pointer || v.IsNil() || v.Elem().Kind() != reflect.Struct {
		return false
	}
	f := v.Elem().FieldByName("path")
	return f.IsValid() && f.CanUint() && f.Uint() == fallbackPath
}
