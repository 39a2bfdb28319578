package report

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/rationhq/ration/sim/engine"
)

// column is one of a table's headers and how its cell is computed from a
// row of type T.
type column[T any] struct {
	head string
	cell func(T) string
}

// runColumns are the columns that name a row's run, first in every
// table, read from the run of a row of type T.
func runColumns[T any](run func(T) *engine.Result) []column[T] {
	return []column[T]{
		{"scenario", func(x T) string { return run(x).Scenario }},
		{"strategy", func(x T) string { return string(run(x).Strategy) }},
		{"N", func(x T) string { return fmt.Sprint(run(x).Instances) }},
		{"load", func(x T) string { return load(run(x)) }},
	}
}

// columns returns the table's columns in order.
func columns() []column[*engine.Result] {
	return append(runColumns(func(r *engine.Result) *engine.Result { return r }), []column[*engine.Result]{
		{"admit%", func(r *engine.Result) string { return pct(r.AdmitFrac) }},
		{"vs ideal", func(r *engine.Result) string { return pct(r.VsIdeal) }},
		{"steady%ρ", func(r *engine.Result) string { return pct(r.Steady) }},
		{"over C+ρt", func(r *engine.Result) string { return over(r.OverLimit) }},
		{"over C+ρ(t+TTL)", func(r *engine.Result) string { return over(r.OverLease) }},
		{"Jain", func(r *engine.Result) string { return fmt.Sprintf("%.3f", r.Jain) }},
		{"min p", func(r *engine.Result) string { return fmt.Sprintf("%.3f", r.MinProb) }},
		{"max p", func(r *engine.Result) string { return fmt.Sprintf("%.3f", r.MaxProb) }},
		{"calls/adm", func(r *engine.Result) string { return fmt.Sprintf("%.4f", r.CallsPerAdmit) }},
		{"grants/s", func(r *engine.Result) string { return fmt.Sprintf("%.2f", r.KeyGrantsPerSec) }},
		{"pairs", func(r *engine.Result) string { return fmt.Sprintf("%.1f", r.ActivePairs) }},
		{"grants/s/pair", func(r *engine.Result) string { return fmt.Sprintf("%.3f", r.KeyGrantsPerPair) }},
		{"grants/act", func(r *engine.Result) string { return fmt.Sprintf("%.2f", r.KeyGrantsPerActivation) }},
		{"waited", func(r *engine.Result) string { return pct(r.WaitedFrac) }},
		{"p50", func(r *engine.Result) string { return ms(r.P50) }},
		{"p99", func(r *engine.Result) string { return ms(r.P99) }},
		{"max wait", func(r *engine.Result) string { return ms(r.MaxWait) }},
		{"fallback", func(r *engine.Result) string { return fmt.Sprint(r.Fallback) }},
		{"stranded", func(r *engine.Result) string { return known(r.StrandedUnknown, pct(r.StrandedFrac)) }},
		{"resv/used", func(r *engine.Result) string { return resv(r) }},
		{"retried adm", retried},
		{"RA−ideal p50", func(r *engine.Result) string { return refused(r, signed(r.RetryErrP50)) }},
		{"RA−ideal p99", func(r *engine.Result) string { return refused(r, signed(r.RetryErrP99)) }},
		{"RA late", func(r *engine.Result) string { return refused(r, pct(r.RetryLate)) }},
		{"RA early", func(r *engine.Result) string { return refused(r, pct(r.RetryEarly)) }},
		{"idle held", func(r *engine.Result) string { return fmt.Sprintf("%d/%d", r.IdleHolding, r.IdleChecks) }},
		{"idle units", func(r *engine.Result) string { return fmt.Sprintf("%.0f", r.IdleHeld) }},
	}...)
}

// retried is the share of the client's honoured retries admitted, and of
// how many; "-" without a client.
func retried(r *engine.Result) string {
	share, ok := r.RetriedAdmitted()
	if !ok {
		return "-"
	}
	return fmt.Sprintf("%s of %d", pct(share), r.Retries)
}

// refused is v, or "-" for a run that refused nothing.
func refused(r *engine.Result, v string) string {
	if r.Refusals == 0 {
		return "-"
	}
	return v
}

// signed shows a signed duration in ms, s or h, with its sign.
func signed(d time.Duration) string {
	sign := "+"
	if d < 0 {
		sign, d = "-", -d
	}
	switch {
	case d == 0:
		return "0"
	case d < time.Second:
		return fmt.Sprintf("%s%.1fms", sign, float64(d)/float64(time.Millisecond))
	case d < time.Hour:
		return fmt.Sprintf("%s%.2fs", sign, d.Seconds())
	}
	return fmt.Sprintf("%s%.2fh", sign, d.Hours())
}

func pct(f float64) string { return fmt.Sprintf("%.1f%%", 100*f) }

// known is v, or "-" for a measurement the run could not make.
func known(unknown bool, v string) string {
	if unknown {
		return "-"
	}
	return v
}

// load is the offered load over the limit, as a multiple; "-" for a
// client alone.
func load(r *engine.Result) string {
	if r.Overload == 0 {
		return "-"
	}
	return fmt.Sprintf("%g×", r.Overload)
}

// over shows an overshoot as a percentage of C; at or below the bound
// it shows how far below, in brackets.
func over(f float64) string {
	if f > 0 {
		return fmt.Sprintf("+%.1f%%C", 100*f)
	}
	return fmt.Sprintf("(%.0f%%C)", 100*f)
}

func ms(d time.Duration) string {
	if d == 0 {
		return "0"
	}
	return fmt.Sprintf("%.1fms", float64(d)/float64(time.Millisecond))
}

func resv(r *engine.Result) string {
	if r.UsedTokens == 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f×", float64(r.ReservedTokens)/float64(r.UsedTokens))
}

// budgetRow is one budget of one result.
type budgetRow struct {
	r *engine.Result
	b *engine.BudgetResult
}

// budgetColumns returns the per-budget table's columns in order.
func budgetColumns() []column[budgetRow] {
	return append(runColumns(func(x budgetRow) *engine.Result { return x.r }), []column[budgetRow]{
		{"budget", func(x budgetRow) string { return x.b.Name }},
		{"limit", func(x budgetRow) string { return limitOf(x.b) }},
		{"admit%", func(x budgetRow) string { return pct(x.b.AdmitFrac) }},
		{"vs ideal", func(x budgetRow) string { return pct(x.b.VsIdeal) }},
		{"steady%ρ", func(x budgetRow) string { return pct(x.b.Steady) }},
		{"over C+ρt", func(x budgetRow) string { return over(x.b.OverLimit) }},
		{"over C+ρ(t+TTL)", func(x budgetRow) string { return over(x.b.OverLease) }},
		{"granted over bound", func(x budgetRow) string { return grantedOver(x.r, x.b) }},
		{"fallback", func(x budgetRow) string { return fmt.Sprint(x.b.FallbackUnits) }},
		{"stranded", func(x budgetRow) string { return known(x.b.StrandedUnknown, pct(x.b.StrandedFrac)) }},
	}...)
}

// limitOf names a budget's limits, as the gateway's keys file would.
func limitOf(b *engine.BudgetResult) string {
	var parts []string
	if b.Limits.RPM > 0 {
		parts = append(parts, fmt.Sprintf("RPM %d", b.Limits.RPM))
	}
	if b.Limits.TPM > 0 {
		parts = append(parts, fmt.Sprintf("TPM %d", b.Limits.TPM))
	}
	return strings.Join(parts, ", ")
}

// grantedOver is the worst window of admissions from grants against the
// strategy's own bound (C + ρ(t+TTL) for leased, C + ρt otherwise), as
// over shows it; "-" for strategies with no allocator.
func grantedOver(r *engine.Result, b *engine.BudgetResult) string {
	switch r.Strategy {
	case engine.Leased:
		return over(b.OverLeaseGranted)
	case engine.LeasedStrict, engine.Central:
		return over(b.OverLimitGranted)
	}
	return "-"
}

// Table writes an aligned table of rs, or a Markdown table with markdown.
// When a result is over several clusters, a table follows with one row per
// cluster of those results; when a result has several budgets (and is not
// over clusters, whose budgets are its keys), a table with one row per
// budget of those results.
func Table(w io.Writer, rs []*engine.Result, markdown bool) error {
	if err := writeTable(w, rs, columns(), markdown); err != nil {
		return err
	}
	if err := clusterTable(w, rs, markdown); err != nil {
		return err
	}
	var rows []budgetRow
	for _, r := range rs {
		if len(r.Budgets) < 2 || len(r.Clusters) > 0 { // a run over clusters: one row per cluster, above
			continue
		}
		for i := range r.Budgets {
			rows = append(rows, budgetRow{r, &r.Budgets[i]})
		}
	}
	if len(rows) == 0 {
		return nil
	}
	if _, err := io.WriteString(w, "\n"); err != nil {
		return err
	}
	return writeTable(w, rows, budgetColumns(), markdown)
}

// writeTable writes one row per element of rows.
func writeTable[T any](w io.Writer, rows []T, columns []column[T], markdown bool) error {
	var hs []string
	for _, c := range columns {
		hs = append(hs, c.head)
	}
	cells := make([][]string, len(rows))
	for i, r := range rows {
		for _, c := range columns {
			cells[i] = append(cells[i], c.cell(r))
		}
	}
	return writeCells(w, hs, cells, markdown)
}

// writeCells writes an aligned table, or a Markdown table with markdown.
func writeCells(w io.Writer, heads []string, rows [][]string, markdown bool) error {
	if markdown {
		var b strings.Builder
		row := func(cells []string) { b.WriteString("| " + strings.Join(cells, " | ") + " |\n") }
		seps := make([]string, len(heads))
		for i := range seps {
			seps[i] = "---"
		}
		row(heads)
		row(seps)
		for _, cells := range rows {
			row(cells)
		}
		_, err := io.WriteString(w, b.String())
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	for _, cells := range append([][]string{heads}, rows...) {
		fmt.Fprintln(tw, strings.Join(cells, "\t")+"\t")
	}
	return tw.Flush()
}
