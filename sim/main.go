// Command sim is ration's skew simulator: it drives the real allocator and
// spender code under virtual time and a simulated network and compares
// strategies on identical traffic. See docs/sim.md.
package main

import (
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/rationhq/ration/sim/engine"
	"github.com/rationhq/ration/sim/report"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "sim:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("sim", flag.ContinueOnError)
	scen := fs.String("scenario", "all", "comma-separated scenarios, or all")
	strat := fs.String("strategies", "all", "comma-separated strategies, or all")
	inst := fs.Int("instances", 8, "fleet size N")
	dur := fs.Duration("duration", 5*time.Minute, "virtual time traffic is offered")
	seed := fs.Uint64("seed", 1, "random seed (same seed, same output)")
	md := fs.Bool("markdown", false, "print the table as Markdown")
	if err := fs.Parse(args); err != nil {
		return err
	}
	var scs []engine.Scenario
	if *scen == "all" {
		scs = engine.Scenarios()
	} else {
		for _, n := range strings.Split(*scen, ",") {
			sc, err := engine.ScenarioByName(n)
			if err != nil {
				return err
			}
			scs = append(scs, sc)
		}
	}
	var sts []engine.Strategy
	if *strat == "all" {
		sts = engine.Strategies()
	} else {
		for _, n := range strings.Split(*strat, ",") {
			st, err := engine.ParseStrategy(n)
			if err != nil {
				return err
			}
			sts = append(sts, st)
		}
	}
	var rs []*engine.Result
	for _, sc := range scs {
		for _, st := range sts {
			r, err := engine.Run(engine.Config{Scenario: sc, Strategy: st, Instances: *inst, Duration: *dur, Seed: *seed})
			if err != nil {
				return err
			}
			rs = append(rs, r)
		}
	}
	return report.Table(os.Stdout, rs, *md)
}
