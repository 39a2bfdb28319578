package main

import (
	"log/slog"
	"testing"
	"time"

	"github.com/rationhq/ration"
	"github.com/rationhq/ration/gateway"
	"github.com/rationhq/ration/internal/testkit"
	"github.com/rationhq/ration/spender/spenderhttp"
)

// writeKeys writes keys as a keys file in a temp dir and returns its path.
func writeKeys(t *testing.T, keys []gateway.Key) string {
	t.Helper()
	return testkit.KeysFile(t, keys)
}

// testConfig is the demo on free loopback ports with a temp data dir.
func testConfig(t *testing.T, instances int, keysFile string) config {
	return config{
		listen:    "127.0.0.1:0",
		instances: instances,
		keysFile:  keysFile,
		dataDir:   t.TempDir(),
		leaseTTL:  10 * time.Second,
		drain:     2 * time.Second,
		logLevel:  slog.LevelDebug,
		tokenizer: tokenizerAuto,

		limits:        defaultLimits,
		maxBody:       spenderhttp.DefaultMaxBodyBytes,
		maxInFlight:   spenderhttp.DefaultMaxBodyBytesInFlight,
		upstreamConns: gateway.DefaultUpstreamConns,
	}
}

// startFleet starts the demo and stops it when the test ends, printing
// its logs if the test failed.
func startFleet(t *testing.T, cfg config, clock ration.Clock) *fleet {
	t.Helper()
	f, _ := startFleetLogs(t, cfg, clock)
	return f
}

// startFleetLogs is startFleet, also returning the demo's log buffer.
func startFleetLogs(t *testing.T, cfg config, clock ration.Clock) (*fleet, *testkit.SyncBuffer) {
	t.Helper()
	return startFleetLogsDeps(t, cfg, deps{clock: clock})
}

// startFleetLogsDeps is startFleetLogs with d (its logOut is replaced by
// the returned buffer).
func startFleetLogsDeps(t *testing.T, cfg config, d deps) (*fleet, *testkit.SyncBuffer) {
	t.Helper()
	logs := &testkit.SyncBuffer{}
	d.logOut = logs
	f, err := start(t.Context(), cfg, d)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := f.stop(); err != nil {
			t.Errorf("stop: %v", err)
		}
		if t.Failed() {
			t.Logf("demo logs:\n%s", logs.String())
		}
	})
	return f, logs
}
