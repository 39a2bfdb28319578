package report

import (
	"encoding/csv"
	"fmt"
	"io"
	"strconv"

	"github.com/rationhq/ration/sim/engine"
)

// clusterRow is one cluster of one result.
type clusterRow struct {
	r *engine.Result
	c *engine.ClusterResult
}

// clusterRows returns a row per cluster of every result over several
// clusters.
func clusterRows(rs []*engine.Result) []clusterRow {
	var rows []clusterRow
	for _, r := range rs {
		for i := range r.Clusters {
			rows = append(rows, clusterRow{r, &r.Clusters[i]})
		}
	}
	return rows
}

// clusterColumns returns the per-cluster table's columns in order.
func clusterColumns() []column[clusterRow] {
	return append(runColumns(func(x clusterRow) *engine.Result { return x.r }), []column[clusterRow]{
		{"cluster", func(x clusterRow) string { return x.c.Name }},
		{"lost", func(x clusterRow) string { return map[bool]string{true: "yes", false: "no"}[x.c.Lost] }},
		{"keys", func(x clusterRow) string { return fmt.Sprint(len(x.c.Keys)) }},
		{"offered", func(x clusterRow) string { return fmt.Sprintf("%.0f", x.c.OfferedUnits) }},
		{"admitted", func(x clusterRow) string { return fmt.Sprintf("%.0f", x.c.AdmittedUnits) }},
		{"vs ideal", func(x clusterRow) string { return pct(x.c.VsIdeal) }},
		{"vs ideal in the loss", func(x clusterRow) string { return pct(x.c.VsIdealLoss) }},
		{"grants/s", func(x clusterRow) string { return fmt.Sprintf("%.2f", x.c.KeyGrantsPerSec) }},
		{"fallback", func(x clusterRow) string { return fmt.Sprint(x.c.Fallback) }},
		{"worst key over C+ρt", func(x clusterRow) string { return over(x.c.OverLimit) }},
		{"worst key over C+ρ(t+TTL)", func(x clusterRow) string { return over(x.c.OverLease) }},
		{"granted over bound", func(x clusterRow) string {
			return grantedOver(x.r, &engine.BudgetResult{OverLimitGranted: x.c.OverLimitGranted, OverLeaseGranted: x.c.OverLeaseGranted})
		}},
	}...)
}

// clusterTable writes, after a blank line, a table with one row per
// cluster of the results over several clusters; nothing when there are
// none.
func clusterTable(w io.Writer, rs []*engine.Result, markdown bool) error {
	rows := clusterRows(rs)
	if len(rows) == 0 {
		return nil
	}
	if _, err := io.WriteString(w, "\n"); err != nil {
		return err
	}
	return writeTable(w, rows, clusterColumns(), markdown)
}

// ClustersCSV writes one row per cluster of each result over several
// clusters, in the binding dimension.
func ClustersCSV(w io.Writer, rs []*engine.Result) error {
	cw := csv.NewWriter(w)
	cw.Write([]string{"scenario", "strategy", "instances", "overload", "cluster", "lost", "keys",
		"offered_units", "admitted_units", "ideal_units", "vs_ideal", "loss_admitted_units", "loss_ideal_units", "vs_ideal_loss",
		"calls", "key_grants_per_s", "fallback_admits",
		"over_limit_frac_of_c", "over_lease_frac_of_c", "over_limit_granted_frac_of_c", "over_lease_granted_frac_of_c"})
	for _, x := range clusterRows(rs) {
		r, c := x.r, x.c
		cw.Write([]string{r.Scenario, string(r.Strategy), d(int64(r.Instances)), f(r.Overload), c.Name, strconv.FormatBool(c.Lost), d(int64(len(c.Keys))),
			f(c.OfferedUnits), f(c.AdmittedUnits), f(c.IdealUnits), f(c.VsIdeal), f(c.LossAdmitted), f(c.LossIdeal), f(c.VsIdealLoss),
			d(c.Calls), f(c.KeyGrantsPerSec), d(c.Fallback),
			f(c.OverLimit), f(c.OverLease), f(c.OverLimitGranted), f(c.OverLeaseGranted)})
	}
	cw.Flush()
	return cw.Error()
}
