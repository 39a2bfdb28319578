package gateway

import (
	"fmt"
	"sort"
	"time"

	"github.com/rationhq/ration"
	"github.com/rationhq/ration/spender/spenderhttp"
)

// Rates are a budget's limits as the keys file writes them: a key's own
// (beside its rpm and tpm), a tenant's (shared by every key of the
// tenant), a key's on one model, or a model's over every key. Every field
// is optional; 0 means not limited.
//
//	{"rpm": 100, "tpm": 150000, "itpm": 100000, "otpm": 20000, "rpd": 10000, "tpd": 5000000}
type Rates struct {
	RPM  int64 `json:"rpm,omitempty"`  // requests per minute
	TPM  int64 `json:"tpm,omitempty"`  // tokens per minute, prompt and completion together
	ITPM int64 `json:"itpm,omitempty"` // input (prompt) tokens per minute
	OTPM int64 `json:"otpm,omitempty"` // output (completion) tokens per minute
	RPD  int64 `json:"rpd,omitempty"`  // requests per day
	TPD  int64 `json:"tpd,omitempty"`  // tokens per day, prompt and completion together
}

// rateBudget is one budget a Rates defines: the suffix of its id, its
// limits, its meter and the fields of the file it comes from.
type rateBudget struct {
	suffix string
	lim    ration.Limits
	meter  spenderhttp.Meter
	fields [2]string // the keys file's names of its two fields (or one)
}

// budgets returns the budgets r defines, each limited: rpm and tpm as one
// per-minute budget (suffix ""), itpm ("/in"), otpm ("/out"), rpd and tpd
// as one per-day budget ("/day").
func (r Rates) budgets() []rateBudget {
	all := []rateBudget{
		{"", ration.Limits{RPM: r.RPM, TPM: r.TPM}, spenderhttp.TotalTokens, [2]string{"rpm", "tpm"}},
		{"/in", ration.Limits{TPM: r.ITPM}, spenderhttp.InputTokens, [2]string{"itpm"}},
		{"/out", ration.Limits{TPM: r.OTPM}, spenderhttp.OutputTokens, [2]string{"otpm"}},
		{"/day", ration.Limits{RPM: r.RPD, TPM: r.TPD, Window: 24 * time.Hour}, spenderhttp.TotalTokens, [2]string{"rpd", "tpd"}},
	}
	out := all[:0]
	for _, b := range all {
		if !b.lim.Unlimited() {
			out = append(out, b)
		}
	}
	return out
}

// validate reports the first field of r the limiter could not hold, as
// the file spells it, with the reason.
func (r Rates) validate() (field string, err error) {
	for _, b := range r.budgets() {
		if err := b.lim.Validate(); err != nil {
			le, _ := err.(*ration.LimitsError)
			field = b.fields[0]
			if le != nil && (le.Field == "tpm" || le.Field == "burst_tokens") && b.fields[1] != "" {
				field = b.fields[1]
			}
			if le != nil {
				err = fmt.Errorf("%q: %s (0 = unlimited)", field, le.Reason)
			}
			return field, err
		}
	}
	return "", nil
}

// spend returns r's budgets under the id base and scope, for a principal.
// skipMinute leaves out the per-minute rpm/tpm budget (a key's own, which
// is its Principal's Limits).
func (r Rates) spend(base, scope string, skipMinute bool) []spenderhttp.Budget {
	var out []spenderhttp.Budget
	for _, b := range r.budgets() {
		if skipMinute && b.suffix == "" {
			continue
		}
		out = append(out, spenderhttp.Budget{Key: base + b.suffix, Scope: scope, Limits: b.lim, Meter: b.meter})
	}
	return out
}

// sortedNames returns m's names, sorted.
func sortedNames[V any](m map[string]V) []string {
	names := make([]string, 0, len(m))
	for n := range m {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}
