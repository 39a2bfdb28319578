package report

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/rationhq/ration/sim/engine"
)

// column is one of the table's headers and how its cell is computed.
type column struct {
	head string
	cell func(r *engine.Result) string
}

// columns returns the table's columns in order.
func columns() []column {
	return []column{
		{"scenario", func(r *engine.Result) string { return r.Scenario }},
		{"strategy", func(r *engine.Result) string { return string(r.Strategy) }},
		{"admit%", func(r *engine.Result) string { return pct(r.AdmitFrac) }},
		{"vs ideal", func(r *engine.Result) string { return pct(r.VsIdeal) }},
		{"steady%ρ", func(r *engine.Result) string { return pct(r.Steady) }},
		{"over C+ρt", func(r *engine.Result) string { return over(r.OverLimit) }},
		{"over C+ρ(t+TTL)", func(r *engine.Result) string { return over(r.OverLease) }},
		{"Jain", func(r *engine.Result) string { return fmt.Sprintf("%.3f", r.Jain) }},
		{"min p", func(r *engine.Result) string { return fmt.Sprintf("%.3f", r.MinProb) }},
		{"max p", func(r *engine.Result) string { return fmt.Sprintf("%.3f", r.MaxProb) }},
		{"calls/adm", func(r *engine.Result) string { return fmt.Sprintf("%.4f", r.CallsPerAdmit) }},
		{"waited", func(r *engine.Result) string { return pct(r.WaitedFrac) }},
		{"p50", func(r *engine.Result) string { return ms(r.P50) }},
		{"p99", func(r *engine.Result) string { return ms(r.P99) }},
		{"max wait", func(r *engine.Result) string { return ms(r.MaxWait) }},
		{"fallback", func(r *engine.Result) string { return fmt.Sprint(r.Fallback) }},
		{"stranded", func(r *engine.Result) string { return pct(r.StrandedFrac) }},
		{"resv/used", func(r *engine.Result) string { return resv(r) }},
	}
}

func pct(f float64) string { return fmt.Sprintf("%.1f%%", 100*f) }

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

// Table writes an aligned table of rs, or a Markdown table with markdown.
func Table(w io.Writer, rs []*engine.Result, markdown bool) error {
	columns := columns()
	if markdown {
		var b strings.Builder
		row := func(cells []string) { b.WriteString("| " + strings.Join(cells, " | ") + " |\n") }
		heads := make([]string, len(columns))
		seps := make([]string, len(columns))
		for i, c := range columns {
			heads[i], seps[i] = c.head, "---"
		}
		row(heads)
		row(seps)
		for _, r := range rs {
			cells := make([]string, len(columns))
			for i, c := range columns {
				cells[i] = c.cell(r)
			}
			row(cells)
		}
		_, err := io.WriteString(w, b.String())
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	for i, c := range columns {
		if i > 0 {
			fmt.Fprint(tw, "\t")
		}
		fmt.Fprint(tw, c.head)
	}
	fmt.Fprintln(tw, "\t")
	for _, r := range rs {
		for i, c := range columns {
			if i > 0 {
				fmt.Fprint(tw, "\t")
			}
			fmt.Fprint(tw, c.cell(r))
		}
		fmt.Fprintln(tw, "\t")
	}
	return tw.Flush()
}
