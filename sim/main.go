// Command sim is ration's skew simulator: it drives the real allocator and
// spender code under virtual time and a simulated network and compares
// strategies on identical traffic. It prints an aligned table and, with
// -out, writes CSV files and SVG plots. See docs/sim.md.
//
//	go run ./sim                                   # every scenario and strategy, 5 virtual minutes
//	go run ./sim -scenario zipf,one -strategies static,leased -instances 16
//	go run ./sim -out docs/sim -markdown           # what docs/performance.md shows
//	go run ./sim -strategies leased,leased-strict -instances 8,64 -overload 0.8,2,5 -check  # a sweep, checked against the targets
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/rationhq/ration/allocator/ledger"
	"github.com/rationhq/ration/sim/engine"
	"github.com/rationhq/ration/sim/report"
	"github.com/rationhq/ration/spender"
)

func main() {
	err := run(os.Args[1:], os.Stdout, os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if errors.Is(err, errMissed) {
		fmt.Fprintln(os.Stderr, "sim:", err)
		os.Exit(1)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "sim:", err)
		os.Exit(2)
	}
}

// errMissed is returned by run when -check finds a row missing a target.
var errMissed = errors.New("a row misses a target")

func run(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("sim", flag.ContinueOnError)
	fs.SetOutput(stderr)
	scen := fs.String("scenario", "all", "comma-separated scenarios ("+strings.Join(scenarioNames(), ", ")+"), or all")
	strat := fs.String("strategies", "all", "comma-separated strategies (static, central, leased, leased-strict, sticky), or all")
	inst := fs.String("instances", "8", "fleet size N (the maximum, for autoscale), or a comma-separated list to sweep")
	dur := fs.Duration("duration", 0, "virtual time traffic is offered (0: the scenario's own, 5m but for client and client-load, 1h, and client-day, 49h)")
	seed := fs.Uint64("seed", 1, "random seed: same seed, same output")
	out := fs.String("out", "", "directory for CSV files and SVG plots (none if empty)")
	md := fs.Bool("markdown", false, "print the table as Markdown")
	progress := fs.Bool("progress", true, "show a progress bar on stderr when a run takes more than 2 s")
	overload := fs.String("overload", "2", "offered load over the binding limit's rate, or a comma-separated list to sweep")
	check := fs.Bool("check", false, "check the leased and leased-strict rows against the targets (PASS/MISS per target); exit 1 if a row misses one")
	refresh := fs.Duration("refresh", 0, "refresh interval active (key, gateway) pairs are counted over, and the key-grants target's (0: the lease horizon)")
	rpm := fs.Int64("rpm", 0, "requests per minute of the key (per day for client-day), or of the team for team (its keys get 4/6, 3/6, 2/6, 1/6 of it) (0: the scenario's, 6000 but for the client scenarios; the tokens scenarios are TPM-only)")
	tpm := fs.Int64("tpm", 0, "tokens per minute of the key for tokens, or of input and output together for tokens-io (11/120 input, the rest output) (0: 1,200,000)")
	ttl := fs.Duration("ttl", 10*time.Second, "allocator lease TTL")
	fallback := fs.String("fallback", "share", "leased spenders' fallback policy: share, closed or open")
	latency := fs.Duration("latency", time.Millisecond, "one-way network latency")
	jitter := fs.Duration("jitter", 500*time.Microsecond, "added uniform network jitter")
	loss := fs.Float64("loss", 0, "message loss probability each way (the lossy scenario adds 5%)")
	callTimeout := fs.Duration("call-timeout", 0, "how long a central slot waits for a lost reply (leased spenders use their own attempt timeout); 0: ten round trips, at least 25ms")
	deadline := fs.Duration("deadline", 50*time.Millisecond, "spender slow-path deadline")
	horizon := fs.Duration("horizon", 2*time.Second, "spender lease horizon")
	policyHorizon := fs.Duration("policy-horizon", 0, "allocator ShareByRate horizon (0: the TTL)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	scs, err := parseScenarios(*scen)
	if err != nil {
		return err
	}
	sts, err := parseStrategies(*strat)
	if err != nil {
		return err
	}
	fb, err := parseFallback(*fallback)
	if err != nil {
		return err
	}
	ns, err := parseList(*inst, "instances", func(v string) (int, error) {
		n, err := strconv.Atoi(v)
		if err == nil && n <= 0 {
			err = errors.New("not positive")
		}
		return n, err
	})
	if err != nil {
		return err
	}
	loads, err := parseList(*overload, "overload", func(v string) (float64, error) {
		x, err := strconv.ParseFloat(v, 64)
		if err == nil && !(x > 0) {
			err = errors.New("not positive")
		}
		return x, err
	})
	if err != nil {
		return err
	}
	base := engine.Config{
		Duration: *dur, Seed: *seed, Refresh: *refresh,
		Net:          engine.Net{Latency: *latency, Jitter: *jitter, Loss: *loss, CallTimeout: *callTimeout},
		TTL:          *ttl,
		Fallback:     fb,
		SlowDeadline: *deadline,
		Horizon:      *horizon,
	}
	if *policyHorizon > 0 {
		base.Policy = ledger.ShareByRate{Horizon: *policyHorizon}
	}
	sweep := len(ns) > 1 || len(loads) > 1
	runs := 0
	for _, sc := range scs {
		if sc.Loaded() {
			runs += len(loads)
		} else {
			runs++
		}
	}
	bar := report.NewProgress(stderr, len(ns)*runs*len(sts), *progress && isTerminal(stderr))
	var rs []*engine.Result
	var groups []group
	for _, n := range ns {
		for oi, o := range loads {
			g := group{n: n, load: o}
			for _, sc := range scs {
				if oi > 0 && !sc.Loaded() {
					continue // the same run at every load: once
				}
				for _, st := range sts {
					cfg := base
					cfg.Instances, cfg.Overload = n, o
					cfg.Scenario, cfg.Strategy = sc, st
					switch lim := sc.DefaultLimits(); {
					case sc.Tokens && *tpm > 0:
						lim.TPM = *tpm
						cfg.Limits = lim
					case !sc.Tokens && *rpm > 0:
						lim.RPM = *rpm
						cfg.Limits = lim
					}
					name := sc.Name + "/" + string(st)
					if sweep {
						name = fmt.Sprintf("N=%d %g× %s", n, o, name)
					}
					cfg.Progress = bar.Run(name)
					r, err := engine.Run(cfg)
					if err != nil {
						return err
					}
					rs = append(rs, r)
					g.rs = append(g.rs, r)
				}
			}
			groups = append(groups, g)
		}
	}
	bar.Done()
	if err := report.Table(stdout, rs, *md); err != nil {
		return err
	}
	if *out != "" {
		if err := writeOut(*out, rs, groups, scs, sweep); err != nil {
			return err
		}
	}
	if !*check {
		return nil
	}
	if _, err := io.WriteString(stdout, "\n"); err != nil {
		return err
	}
	vs := report.Check(rs)
	missed, err := report.CheckTable(stdout, vs, *md)
	if err != nil {
		return err
	}
	if missed > 0 {
		return fmt.Errorf("%d of %d checked rows: %w", missed, len(vs), errMissed)
	}
	return nil
}

// group is the runs of one fleet size and offered load.
type group struct {
	n    int
	load float64
	rs   []*engine.Result
}

// writeOut writes the CSV files and plots into dir; a sweep writes every
// result's row into dir/results.csv and dir/budgets.csv, and each fleet
// size and load's files and plots into its own subdirectory,
// n<N>-load<load>.
func writeOut(dir string, rs []*engine.Result, groups []group, scs []engine.Scenario, sweep bool) error {
	if !sweep {
		return report.WriteAll(dir, rs, scs)
	}
	for _, g := range groups {
		if err := report.WriteAll(filepath.Join(dir, fmt.Sprintf("n%d-load%g", g.n, g.load)), g.rs, scs); err != nil {
			return err
		}
	}
	for name, write := range map[string]func(io.Writer, []*engine.Result) error{"results.csv": report.ResultsCSV, "budgets.csv": report.BudgetsCSV} {
		f, err := os.Create(filepath.Join(dir, name))
		if err != nil {
			return err
		}
		err = write(f, rs)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// parseList parses a comma-separated list of one or more values.
func parseList[T any](v, flagName string, parse func(string) (T, error)) ([]T, error) {
	var xs []T
	for _, p := range strings.Split(v, ",") {
		x, err := parse(strings.TrimSpace(p))
		if err != nil {
			return nil, fmt.Errorf("-%s %q: %w", flagName, p, err)
		}
		xs = append(xs, x)
	}
	return xs, nil
}

// isTerminal reports whether w is a character device (a terminal), where
// a redrawn progress line makes sense.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

func scenarioNames() []string {
	var ns []string
	for _, s := range engine.Scenarios() {
		ns = append(ns, s.Name)
	}
	return ns
}

func parseScenarios(v string) ([]engine.Scenario, error) {
	if v == "all" {
		return engine.Scenarios(), nil
	}
	var scs []engine.Scenario
	for _, n := range strings.Split(v, ",") {
		sc, err := engine.ScenarioByName(strings.TrimSpace(n))
		if err != nil {
			return nil, err
		}
		scs = append(scs, sc)
	}
	return scs, nil
}

func parseStrategies(v string) ([]engine.Strategy, error) {
	if v == "all" {
		return engine.Strategies(), nil
	}
	var sts []engine.Strategy
	for _, n := range strings.Split(v, ",") {
		st, err := engine.ParseStrategy(strings.TrimSpace(n))
		if err != nil {
			return nil, err
		}
		sts = append(sts, st)
	}
	return sts, nil
}

func parseFallback(v string) (spender.FallbackPolicy, error) {
	for _, p := range []spender.FallbackPolicy{spender.FallbackShare, spender.FailClosed, spender.FailOpen} {
		if p.String() == v {
			return p, nil
		}
	}
	return 0, fmt.Errorf("unknown fallback policy %q (want share, closed or open)", v)
}
