package report

import (
	"bytes"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"time"

	"github.com/rationhq/ration/sim/engine"
	"github.com/rationhq/ration/spender"
)

// color returns a strategy's plot color, fixed so plots compare across files.
func color(st engine.Strategy) string {
	switch st {
	case engine.Static:
		return "#d62728"
	case engine.Central:
		return "#9467bd"
	case engine.Leased:
		return "#2ca02c"
	case engine.LeasedStrict:
		return "#1f77b4"
	}
	return "#ff7f0e" // sticky
}

// WriteAll writes results.csv, budgets.csv, instances.csv, series.csv,
// clusters.csv (the rows of results over several clusters),
// one time-series plot per scenario (<scenario>.svg), summary.svg
// (admitted fraction), fairness.svg (Jain's index), when the zipf
// scenario ran, instances-zipf.svg (admission probability by instance)
// and, for each scenario with several budgets, budgets-<scenario>.svg
// (each budget's admissions against the ideal) into dir.
func WriteAll(dir string, rs []*engine.Result, scs []engine.Scenario) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	files := map[string]func(io.Writer){
		"results.csv":   func(w io.Writer) { ResultsCSV(w, rs) },
		"budgets.csv":   func(w io.Writer) { BudgetsCSV(w, rs) },
		"instances.csv": func(w io.Writer) { InstancesCSV(w, rs) },
		"series.csv":    func(w io.Writer) { SeriesCSV(w, rs) },
		"clusters.csv":  func(w io.Writer) { ClustersCSV(w, rs) },
		"summary.svg": func(w io.Writer) {
			grouped(w, rs, scs, "Admitted, % of what the limit allows (C + ρt)", "% of C + ρt", 0,
				func(r *engine.Result) float64 { return 100 * r.AdmitFrac })
		},
		"fairness.svg": func(w io.Writer) {
			grouped(w, rs, scs, "Jain's fairness index of per-instance admission probability", "Jain index", 1,
				func(r *engine.Result) float64 { return r.Jain })
		},
	}
	for _, sc := range scs {
		var of []*engine.Result
		for _, r := range rs {
			if r.Scenario == sc.Name {
				of = append(of, r)
			}
		}
		if len(of) == 0 {
			continue
		}
		files[sc.Name+".svg"] = func(w io.Writer) { timeSeries(w, sc, of) }
		if sc.Name == "zipf" {
			files["instances-zipf.svg"] = func(w io.Writer) { perInstance(w, sc, of) }
		}
		if len(of[0].Budgets) > 1 {
			files["budgets-"+sc.Name+".svg"] = func(w io.Writer) { perBudget(w, sc, of) }
		}
	}
	for name, write := range files {
		var b bytes.Buffer
		write(&b)
		if err := os.WriteFile(filepath.Join(dir, name), b.Bytes(), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// grouped plots one value per scenario and strategy as grouped bars.
func grouped(w io.Writer, rs []*engine.Result, scs []engine.Scenario, title, ylabel string, ymax float64, v func(*engine.Result) float64) {
	var groups []string
	for _, sc := range scs {
		groups = append(groups, sc.Name)
	}
	sts := strategiesOf(rs)
	vals := make([][]float64, len(sts))
	var names, cols []string
	for s, st := range sts {
		names, cols = append(names, string(st)), append(cols, color(st))
		vals[s] = make([]float64, len(groups))
		for g := range groups {
			vals[s][g] = math.NaN()
			for _, r := range rs {
				if r.Scenario == groups[g] && r.Strategy == st {
					vals[s][g] = v(r)
				}
			}
		}
	}
	barChart(w, title, ylabel, groups, names, cols, vals, ymax)
}

func strategiesOf(rs []*engine.Result) []engine.Strategy {
	var sts []engine.Strategy
	for _, st := range engine.Strategies() {
		for _, r := range rs {
			if r.Strategy == st {
				sts = append(sts, st)
				break
			}
		}
	}
	return sts
}

// timeSeries plots the admitted rate of each strategy over time, with the
// offered rate and the limit's refill rate, averaged over windows of 1/100
// of the run (at least one bucket).
func timeSeries(w io.Writer, sc engine.Scenario, rs []*engine.Result) {
	r0 := rs[0]
	n := len(r0.Series)
	if n == 0 {
		return
	}
	step := r0.Series[0].At
	if n > 1 {
		step = r0.Series[1].At - r0.Series[0].At
	}
	k := max(1, n/100)
	avg := func(get func(engine.Point) float64, series []engine.Point) (xs, ys []float64) {
		for i := 0; i+k <= len(series); i += k {
			s := 0.0
			for _, p := range series[i : i+k] {
				s += get(p)
			}
			xs = append(xs, (series[i].At + step*time.Duration(k)/2).Seconds())
			ys = append(ys, s/float64(k)/step.Seconds())
		}
		return xs, ys
	}
	unit := "requests/s"
	if r0.Dim == spender.Tokens {
		unit = "tokens/s"
	}
	var ls []line
	xs, ys := avg(func(p engine.Point) float64 { return p.Offered }, r0.Series)
	ls = append(ls, line{name: "offered", color: "#999999", xs: xs, ys: ys})
	ls = append(ls, line{name: "limit ρ", color: "#000000", dashed: true, xs: []float64{0, r0.Duration.Seconds()}, ys: []float64{r0.Rate, r0.Rate}})
	for _, r := range rs {
		xs, ys := avg(func(p engine.Point) float64 { return p.Admitted }, r.Series)
		ls = append(ls, line{name: string(r.Strategy), color: color(r.Strategy), xs: xs, ys: ys})
	}
	title := fmt.Sprintf("%s: admitted %s (N=%d, seed %d)", sc.Name, unit, r0.Instances, r0.Seed)
	if len(r0.Budgets) > 1 {
		title = fmt.Sprintf("%s: admitted %s of budget %s (N=%d, seed %d)", sc.Name, unit, r0.Primary, r0.Instances, r0.Seed)
	}
	lineChart(w, title, "virtual time (s)", unit, r0.Duration.Seconds(), ls)
}

// perInstance plots each instance's admission probability by strategy.
func perInstance(w io.Writer, sc engine.Scenario, rs []*engine.Result) {
	n := len(rs[0].InstOffered)
	groups := make([]string, n)
	for i := range groups {
		groups[i] = fmt.Sprint(i)
	}
	var names, cols []string
	vals := make([][]float64, len(rs))
	for s, r := range rs {
		names, cols = append(names, string(r.Strategy)), append(cols, color(r.Strategy))
		vals[s] = make([]float64, n)
		for i := range vals[s] {
			vals[s][i] = math.NaN()
			if r.InstOffered[i] > 0 {
				vals[s][i] = float64(r.InstAdmitted[i]) / float64(r.InstOffered[i])
			}
		}
	}
	barChart(w, sc.Name+": admission probability by instance (0 gets the most traffic)", "admitted / offered", groups, names, cols, vals, 1)
}

// perBudget plots each budget's admissions as a percentage of what the
// ideal (one exact bucket per budget) admitted, by strategy.
func perBudget(w io.Writer, sc engine.Scenario, rs []*engine.Result) {
	var groups []string
	for _, b := range rs[0].Budgets {
		groups = append(groups, b.Name)
	}
	var names, cols []string
	vals := make([][]float64, len(rs))
	for s, r := range rs {
		names, cols = append(names, string(r.Strategy)), append(cols, color(r.Strategy))
		vals[s] = make([]float64, len(groups))
		for i, b := range r.Budgets {
			vals[s][i] = 100 * b.VsIdeal
		}
	}
	barChart(w, sc.Name+": admitted per budget, % of one exact bucket per budget", "% of the ideal", groups, names, cols, vals, 0)
}
