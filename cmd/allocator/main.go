// Command allocator runs ration's central lease service: it owns every API
// key's global RPM/TPM budget, hands out leases to spenders over Connect,
// gRPC and gRPC-Web, and keeps its ledger durable in bbolt.
//
// Configuration comes from flags or RATION_* environment variables (see
// -help and docs/allocator.md). SIGTERM or SIGINT drains in-flight calls,
// then closes the store.
//
// With -cluster-id it is a member of a raft cluster (docs/cluster.md),
// operated with subcommands that call a member's admin API:
//
//	allocator cluster members|add|remove ...
//	allocator backup -out FILE
//	allocator restore -in FILE
//
// allocator -version prints the build's version and exits.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/rationhq/ration/internal/version"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if version.Requested(os.Args[1:]) {
		fmt.Println("allocator", version.String())
		return
	}
	if isOp(os.Args[1:]) {
		err := runOp(ctx, os.Args[1:], os.Getenv, os.Stdout)
		if errors.Is(err, flag.ErrHelp) {
			return
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, prefixed(err))
			os.Exit(exitFailed)
		}
		return
	}
	cfg, err := parseConfig(os.Args[1:], os.Getenv, os.Stdout)
	if errors.Is(err, flag.ErrHelp) {
		return // -help printed the usage: not a failure
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, prefixed(err)+" ('allocator -help' lists the flags)")
		os.Exit(exitUsage)
	}
	if err := run(ctx, cfg, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, prefixed(err))
		if errors.Is(err, errRemoved) {
			os.Exit(exitRemoved)
		}
		os.Exit(exitFailed)
	}
}

// prefixed is err's message starting with "allocator: " once: errors from
// the allocator package already carry it.
func prefixed(err error) string {
	if msg := err.Error(); strings.HasPrefix(msg, "allocator: ") {
		return msg
	}
	return "allocator: " + err.Error()
}
