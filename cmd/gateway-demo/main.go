// Command gateway-demo runs ration end to end on one machine: an
// allocator (embedded, its ledger in a bbolt file in the data directory),
// several OpenAI-compatible gateway instances on consecutive localhost
// ports sharing each API key's global budget through leases, and the echo
// engine behind them. It prints the demo API keys and curl lines to try.
//
//	go run ./cmd/gateway-demo
//
// Flags and RATION_DEMO_* environment variables are described by -help
// and docs/gateway-demo.md. Ctrl-C or SIGTERM drains in-flight requests,
// returns every instance's leases to the allocator and closes the store.
// SIGHUP reloads the keys file (-keys), which is also reloaded when its
// content changes.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"

	"github.com/rationhq/ration/internal/version"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	hup, stopHUP := notifyReload() // before anything else: an unhandled SIGHUP would end the process
	defer stopHUP()
	if version.Requested(os.Args[1:]) {
		fmt.Println("gateway-demo", version.String())
		return
	}
	cfg, err := parseConfig(os.Args[1:], os.Getenv, os.Stdout)
	if errors.Is(err, flag.ErrHelp) {
		return // -help printed the usage: not a failure
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "gateway-demo:", err, "('gateway-demo -help' lists the flags)")
		os.Exit(2)
	}
	limitMemory(cfg, os.Getenv)
	if err := run(ctx, cfg, deps{out: os.Stdout, logOut: os.Stderr, hup: hup}); err != nil {
		fmt.Fprintln(os.Stderr, "gateway-demo:", err)
		os.Exit(1)
	}
}

// notifyReload returns the channel SIGHUP arrives on from now on, the
// signal that reloads the keys file, and the function that undoes it.
// SIGHUP's default action ends the process; once this has run it does not.
func notifyReload() (<-chan os.Signal, func()) {
	hup := make(chan os.Signal, 1) // signals while a reload runs coalesce into one more
	signal.Notify(hup, syscall.SIGHUP)
	return hup, func() { signal.Stop(hup) }
}

// memoryBase is what limitMemory allows on top of the instances' body caps:
// the runtime, the embedded allocator and echo engine at rest, the keys.
const memoryBase = 64 << 20

// limitMemory sets the Go runtime's soft memory limit to the body bytes
// the instances may hold at once (-max-body-in-flight each) plus
// memoryBase, unless GOMEMLIMIT says otherwise. Without it the collector
// lets the heap grow to twice what is live before it runs, and a gateway
// at its cap of large bodies, whose reads and parses leave as much garbage
// as they keep, sat at three times the cap; with a limit of 1.5 times the
// cap it still reached 1.5 times the cap plus the base on a loaded
// machine, the most the fault suite allows
// (TestRealBodiesStayWithinTheCap); with this one, 1.25 times.
func limitMemory(cfg config, getenv func(string) string) {
	if getenv("GOMEMLIMIT") != "" {
		return
	}
	debug.SetMemoryLimit(int64(cfg.instances)*cfg.maxInFlight + memoryBase)
}
