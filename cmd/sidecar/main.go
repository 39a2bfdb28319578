// Command sidecar runs beside one gateway instance and admits its requests
// against ration's budgets, for gateways that are not written in Go. It
// holds a leased Limiter (from an allocator cluster, or -embedded: an
// in-process allocator for one machine) and serves, on one listener
// (loopback TCP or a unix socket):
//
//   - Envoy's rate limit service (envoy.service.ratelimit.v3, gRPC), with
//     envoyproxy/ratelimit's YAML configuration files (-ratelimit-config);
//
//   - the reserve/settle API (ration.sidecar.v1.ReservationService:
//     Connect JSON over HTTP, gRPC, gRPC-Web), for any language;
//
//   - /healthz, /readyz and /metrics.
//
//     sidecar -embedded -ratelimit-config /etc/ratelimit
//     sidecar -allocator http://a:7450,http://b:7450,http://c:7450 -token-file /etc/ration/token
//
// Flags and RATION_SIDECAR_* environment variables are listed by -help
// and described in docs/integrations.md; -version prints the build. SIGTERM or SIGINT drains in-flight calls,
// settles the reservations still held at their reserved cost and returns
// every lease. SIGHUP reloads the rate limit configuration, which is also
// reloaded when its files change.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/rationhq/ration/internal/version"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	hup := make(chan os.Signal, 1) // before anything else: an unhandled SIGHUP would end the process
	signal.Notify(hup, syscall.SIGHUP)
	if version.Requested(os.Args[1:]) {
		fmt.Println("sidecar", version.String())
		return
	}
	cfg, err := parseConfig(os.Args[1:], os.Getenv, os.Stdout)
	if errors.Is(err, flag.ErrHelp) {
		return // -help printed the usage: not a failure
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "sidecar:", err, "('sidecar -help' lists the flags)")
		os.Exit(2)
	}
	if err := run(ctx, cfg, deps{logOut: os.Stderr, hup: hup}); err != nil {
		fmt.Fprintln(os.Stderr, "sidecar:", err)
		os.Exit(1)
	}
}
